"""Queue policies: which waiting request is served first, for the engine and the tick simulators alike.

A policy reads a waiting request through a small interface, :class:`Queued`: its place in arrival order,
its priority class and the tokens it still owes. The engine's ``Sequence`` and the simulators' views of
their requests both provide it, so the engine's scheduler (``EngineConfig.policy`` names one of
:data:`ENGINE_POLICIES`) and :mod:`servelab.batching` sort with the same functions.

* A *key* maps one request to a tuple; smaller keys are served first (and, in the engine, preempted
  last). Every key ends with the arrival index, so the order is total and deterministic.
* :func:`aging` is a key over :class:`Aged` requests, which also know how long they have waited.
* :func:`fair_queuing` orders a whole queue of :class:`Tenanted` requests, since its next pick depends on
  the picks before it (a virtual token counter per tenant).

System boundary: ordering only. Whether a request fits (batch slots, token budget, KV blocks) is the
scheduler's decision. The state aging and fair queuing read is the caller's: the engine's scheduler counts
waiting in scheduler ticks and tokens served per tenant (``servelab.engine.scheduler``), the simulators
in their own ticks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, TypeVar

__all__ = ["Queued", "Aged", "Tenanted", "Key", "fcfs", "priority", "shortest_job_first", "POLICIES", "aging",
           "fair_queuing", "ENGINE_POLICIES", "running_key", "rank_waiting"]


class Queued(Protocol):
    """What every policy reads from a waiting request."""

    @property
    def arrival_index(self) -> int:
        """Place in arrival order (distinct per request: the tie-breaker that makes orders total)."""

    @property
    def priority(self) -> int:
        """Priority class: lower is served first."""

    @property
    def remaining_tokens(self) -> int:
        """Tokens it may still generate: a proxy for (or an oracle of) its remaining work."""


class Aged(Queued, Protocol):
    """A waiting request that also knows how long it has waited."""

    @property
    def waited(self) -> int:
        """Time waited so far, in the caller's unit (ticks in the simulators)."""


class Tenanted(Queued, Protocol):
    """A waiting request that also names who sent it."""

    @property
    def tenant(self) -> str:
        """The tenant fair queuing shares service between."""


Key = Callable[[Queued], tuple]
_T = TypeVar("_T", bound=Tenanted)


def fcfs(req: Queued) -> tuple:
    """First come, first served: arrival order."""
    return (req.arrival_index,)


def priority(req: Queued) -> tuple:
    """Lower ``priority`` value first, then arrival order."""
    return (req.priority, req.arrival_index)


def shortest_job_first(req: Queued) -> tuple:
    """Fewest remaining tokens first, then arrival order. In the engine that is ``max_tokens`` minus the
    tokens generated, a proxy: the real output length is unknown until the request stops."""
    return (req.remaining_tokens, req.arrival_index)


POLICIES: dict[str, Key] = {"fcfs": fcfs, "priority": priority, "sjf": shortest_job_first}


def aging(rate: float) -> Callable[[Aged], tuple]:
    """SJF with aging: remaining tokens minus ``rate`` tokens per unit of time already waited, so a long
    job's rank improves while it waits (``rate=0`` is plain SJF)."""
    def key(req: Aged) -> tuple:
        return (req.remaining_tokens - rate * req.waited, req.arrival_index)
    return key


def fair_queuing(waiting: Iterable[_T], served: Mapping[str, int]) -> list[_T]:
    """Per-tenant fair queuing on tokens served; returns ``waiting`` best first.

    ``served`` maps a tenant to the tokens its requests have emitted so far (a missing tenant has 0;
    counters are not lifted when a tenant returns from idle). Repeatedly take the tenant with the
    smallest counter among those with a waiting request (ties: the earlier head of line), rank that
    tenant's earliest waiting request next and charge the tenant one token for the prefill it is about
    to get. Within a tenant the order is FCFS.
    """
    queues: dict[str, list[_T]] = {}
    for req in sorted(waiting, key=fcfs):
        queues.setdefault(req.tenant, []).append(req)
    counters = {t: served.get(t, 0) for t in queues}
    ranked: list[_T] = []
    while any(queues.values()):
        tenant = min((t for t in queues if queues[t]), key=lambda t: (counters[t], queues[t][0].arrival_index))
        ranked.append(queues[tenant].pop(0))
        counters[tenant] += 1
    return ranked


ENGINE_POLICIES = (*POLICIES, "sjf-aging", "fair-queuing")
"""The names ``EngineConfig.policy`` accepts: the three keys, SJF with aging, per-tenant fair queuing."""


def running_key(policy: str) -> Key:
    """The key that orders the running and swapped queues (and picks victims: the largest goes first):
    the policy's own, SJF under ``"sjf-aging"`` (a running request waits no more), FCFS under
    ``"fair-queuing"``."""
    return POLICIES.get(policy, shortest_job_first if policy == "sjf-aging" else fcfs)


def rank_waiting(policy: str, waiting: list[_T], served: Mapping[str, int], aging_rate: float) -> list[_T]:
    """``waiting`` best first under ``policy`` (one of :data:`ENGINE_POLICIES`); ``served`` and
    ``aging_rate`` are read only by fair queuing and by aging."""
    if policy == "fair-queuing":
        return fair_queuing(waiting, served)
    return sorted(waiting, key=aging(aging_rate) if policy == "sjf-aging" else POLICIES[policy])
