"""Queue policies: which waiting request is served first, for the engine and the tick simulators
alike.

A policy reads a waiting request through :class:`Queued` (arrival index, priority class, tokens
still owed), which the ``EngineSequence`` and :mod:`servelab.scheduling.batching`'s requests both
provide. A *key* maps a request to a tuple; smaller keys are served first (in the engine, preempted
last), and every key ends with the arrival index, so the order is total. FCFS, the default, is here;
priority, SJF, SJF with aging and fair queuing are in :mod:`servelab.scheduling.queue_disciplines`.

System boundary: ordering only; whether a request fits (slots, token budget, KV blocks) is the
scheduler's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from servelab.scheduling.queue_disciplines import aging, fair_queuing, priority, shortest_job_first
from servelab.scheduling.queued import Key, Queued

__all__ = ["Queued", "Key", "fcfs", "POLICIES", "ENGINE_POLICIES", "running_key", "rank_waiting"]


_Q = TypeVar("_Q", bound=Queued)


def fcfs(req: Queued) -> tuple:
    """First come, first served: arrival order (the engine's default)."""
    return (req.arrival_index,)


POLICIES: dict[str, Key] = {"fcfs": fcfs, "priority": priority, "sjf": shortest_job_first}

ENGINE_POLICIES = (*POLICIES, "sjf-aging", "fair-queuing")
"""The names ``EngineConfig.policy`` accepts: the three keys, SJF with aging, per-tenant fair
queuing."""


def running_key(policy: str) -> Key:
    """The key that orders the running and swapped queues (and picks victims: the largest goes
    first): the policy's own, SJF under ``"sjf-aging"`` (a running request waits no more), FCFS
    under ``"fair-queuing"``."""
    return POLICIES.get(policy, shortest_job_first if policy == "sjf-aging" else fcfs)


def rank_waiting(
    policy: str, waiting: list[_Q], served: Mapping[str, int], aging_rate: float
) -> list[_Q]:
    """``waiting`` best first under ``policy`` (one of :data:`ENGINE_POLICIES`); ``served`` and
    ``aging_rate`` are read only by fair queuing and by aging."""
    if policy == "fair-queuing":
        return fair_queuing(waiting, served)
    return sorted(waiting, key=aging(aging_rate) if policy == "sjf-aging" else POLICIES[policy])
