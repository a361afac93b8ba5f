"""The queueing disciplines beyond first come, first served: priority classes, shortest job first,
SJF with aging, and per-tenant fair queuing.

Each reads a waiting request through a small protocol (the
:class:`servelab.scheduling.queued.Queued` fields, plus the time waited for aging or the tenant for
fair queuing), so the engine's scheduler (``EngineConfig.policy``, through
:func:`servelab.scheduling.queue_policy.rank_waiting`) and the simulators of
:mod:`servelab.scheduling.batching` share them. SJF starves long requests and arrival order lets one
busy tenant crowd out the rest: :func:`aging` ranks a request better the longer it has waited,
:func:`fair_queuing` serves the tenant with the fewest tokens so far.

System boundary: ordering only. The state they read is the caller's: the engine's scheduler counts
waiting in scheduler ticks and tokens served per tenant, the simulators in their own ticks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, TypeVar

from servelab.scheduling.queued import Queued

__all__ = ["priority", "shortest_job_first", "Aged", "Tenanted", "aging", "fair_queuing"]


def priority(req: "Queued") -> tuple:
    """Lower ``priority`` value first, then arrival order."""
    return (req.priority, req.arrival_index)


def shortest_job_first(req: "Queued") -> tuple:
    """Fewest remaining tokens first, then arrival order. In the engine that is ``max_tokens`` minus
    the tokens generated, a proxy: the real output length is unknown until the request stops."""
    return (req.remaining_tokens, req.arrival_index)


class Aged(Protocol):
    """A waiting request that knows how long it has waited."""

    @property
    def arrival_index(self) -> int:
        """Place in arrival order (the tie-breaker)."""

    @property
    def remaining_tokens(self) -> int:
        """Tokens it may still generate."""

    @property
    def waited(self) -> int:
        """Time waited so far, in the caller's unit (scheduler ticks in the engine, ticks in the
        simulators)."""


class Tenanted(Protocol):
    """A waiting request that names who sent it."""

    @property
    def arrival_index(self) -> int:
        """Place in arrival order (FCFS within a tenant)."""

    @property
    def tenant(self) -> str:
        """The tenant fair queuing shares service between."""


_T = TypeVar("_T", bound=Tenanted)


def aging(rate: float) -> Callable[[Aged], tuple]:
    """SJF with aging: remaining tokens minus ``rate`` tokens per unit of time already waited, so a
    long job's rank improves while it waits (``rate=0`` is plain SJF)."""
    def key(req: Aged) -> tuple:
        return (req.remaining_tokens - rate * req.waited, req.arrival_index)
    return key


def fair_queuing(waiting: Iterable[_T], served: Mapping[str, int]) -> list[_T]:
    """Per-tenant fair queuing on tokens served; returns ``waiting`` best first.

    ``served`` maps a tenant to the tokens its requests have emitted so far (a missing tenant has 0;
    counters are not lifted when a tenant returns from idle). Repeatedly take the tenant with the
    smallest counter among those with a waiting request (ties: the earlier head of line), rank that
    tenant's earliest waiting request next and charge the tenant one token for the prefill it is
    about to get. Within a tenant the order is FCFS.
    """
    queues: dict[str, list[_T]] = {}
    for req in sorted(waiting, key=lambda r: r.arrival_index):
        queues.setdefault(req.tenant, []).append(req)
    counters = {t: served.get(t, 0) for t in queues}
    ranked: list[_T] = []
    while any(queues.values()):
        tenant = min(
            (t for t in queues if queues[t]),
            key=lambda t: (counters[t], queues[t][0].arrival_index),
        )
        ranked.append(queues[tenant].pop(0))
        counters[tenant] += 1
    return ranked
