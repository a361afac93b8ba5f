"""Queue policies: which waiting request is admitted first and which running one is preempted first.

A policy is a sort key over sequences: smaller keys are admitted (and scheduled) first and preempted
last. Every key ends with the arrival index, so the order is total and deterministic. To add a policy,
register its key function in :data:`POLICIES`; ``EngineConfig.policy`` names one of them.

System boundary: ordering only. Whether a request fits (batch slots, token budget, KV blocks) is the
scheduler's decision.
"""

from __future__ import annotations

from collections.abc import Callable

from servelab.engine.sequence import Sequence


def fcfs(seq: Sequence) -> tuple:
    """First come, first served: arrival order."""
    return (seq.arrival_index,)


def priority(seq: Sequence) -> tuple:
    """Lower ``priority`` value first, then arrival order."""
    return (seq.priority, seq.arrival_index)


def shortest_job_first(seq: Sequence) -> tuple:
    """Fewest tokens still allowed to generate (``max_tokens`` minus generated) first: a proxy for the
    remaining work, since the real output length is unknown until the request stops."""
    return (seq.remaining_budget, seq.arrival_index)


POLICIES: dict[str, Callable[[Sequence], tuple]] = {"fcfs": fcfs, "priority": priority, "sjf": shortest_job_first}
