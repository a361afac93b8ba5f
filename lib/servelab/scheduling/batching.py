"""Tick simulations of batching and queueing policies.

System boundary: one replica's scheduler, seen in discrete time. Nothing here runs a model; every
request is reduced to how many tokens it still owes, and time is counted in *ticks*, the duration of
one decode iteration in a unit-cost model. Three simulators share this module:

* ``simulate_batching`` -- static versus continuous batching (each active request emits one token
  per tick; a request's completion tick is the end of its last tick).
* ``simulate_queue_policies`` -- who waits and who starves under FCFS, SJF, prefill-priority and
  decode-priority admission, and three remedies for starvation (SJF with aging, priority classes,
  per-tenant fair queuing), on the same slot loop.
* ``simulate_iterations`` -- chunked versus unchunked prefill on a token-budget cost model, where an
  iteration's duration grows with the number of tokens it processes.

Queue order comes from :mod:`servelab.scheduling.queue_policy`, the keys the engine's scheduler uses
too. Results are exact (integers, or ``fractions.Fraction`` for the token-cost model) so a chart and
a test read the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Mapping, Sequence

from servelab._validate import require_int, require_name, require_real
from servelab.metrics.latency import itl
from servelab.scheduling.queue_disciplines import aging, fair_queuing
from servelab.scheduling.queue_policy import POLICIES, fcfs

__all__ = [
    "BATCHING_POLICIES",
    "QUEUE_POLICIES",
    "Request",
    "TickRecord",
    "simulate_batching",
    "verify_schedule",
    "utilization",
    "QueueOutcome",
    "simulate_queue_policies",
    "PrefillRequest",
    "Iteration",
    "IterationTrace",
    "simulate_iterations",
    "PrefillScenario",
    "chunked_prefill_scenario",
]

BATCHING_POLICIES = ("static", "continuous")
QUEUE_POLICIES = ("fcfs", "sjf", "prefill-priority", "decode-priority", "sjf-aging", "priority",
                  "fair-queuing")


@dataclass(frozen=True)
class Request:
    """A request in the unit-cost tick model.

    ``arrival`` is the first tick at which the scheduler may run it (int >= 0); ``ticks_needed`` is
    the number of output tokens it must produce, one per tick while it holds a slot (int >= 1).
    ``tenant`` names who sent it (per-tenant fair queuing shares slots between tenants) and
    ``priority`` is its class under the ``"priority"`` queue policy (lower is served first).
    """

    name: str
    arrival: int
    ticks_needed: int
    tenant: str = "default"
    priority: int = 0

    def __post_init__(self) -> None:
        require_name("name", self.name)
        require_int("arrival", self.arrival, 0)
        require_int("ticks_needed", self.ticks_needed, 1)
        require_name("tenant", self.tenant)
        require_int("priority", self.priority)


@dataclass(frozen=True)
class TickRecord:
    """What the scheduler did during tick ``tick`` (the interval [tick, tick + 1)).

    ``active`` holds the requests occupying a slot, ``emitting`` those that produced a token (they
    differ only when a prefill iteration stalls running decodes), ``queued`` the arrived requests
    still waiting for a slot.
    """

    tick: int
    active: tuple[str, ...]
    emitting: tuple[str, ...]
    queued: tuple[str, ...]


def _validate_requests(reqs: object) -> list[Request]:
    if not isinstance(reqs, (list, tuple)):
        raise TypeError(f"reqs must be a list or tuple of Request, got {type(reqs).__name__}")
    if not reqs:
        raise ValueError("reqs must contain at least one Request")
    for r in reqs:
        if not isinstance(r, Request):
            raise TypeError(f"reqs must contain only Request objects, got {type(r).__name__}")
    names = [r.name for r in reqs]
    if len(set(names)) != len(names):
        raise ValueError(f"reqs must have unique names, got {names}")
    return list(reqs)


@dataclass(frozen=True)
class _Waiting:
    """A waiting request as the queue policies read it (a
    ``servelab.scheduling.queue_disciplines.Aged`` and ``Tenanted``): ``arrival_index`` ranks
    (arrival tick, place in the workload)."""

    name: str
    arrival_index: int
    priority: int
    remaining_tokens: int
    tenant: str
    waited: int


# A ranking orders the waiting requests for the free slots, best first, given the tokens emitted so
# far per tenant.
Ranking = Callable[[list[_Waiting], Mapping[str, int]], list[_Waiting]]


def _by_key(key: Callable[[_Waiting], tuple]) -> Ranking:
    """A ranking that sorts the waiting requests by ``key``, smallest first."""
    def rank(waiting: list[_Waiting], served: Mapping[str, int]) -> list[_Waiting]:
        return sorted(waiting, key=key)
    return rank


def _arrival_order(reqs: list[Request]) -> dict[str, int]:
    """Each request's place in arrival order: by arrival tick, ties by place in the workload."""
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i].arrival, i))
    return {reqs[i].name: k for k, i in enumerate(order)}


def _waiting(
    reqs: list[Request],
    arrival_index: Mapping[str, int],
    tick: int,
    owed: Mapping[str, int],
    active: list[str],
) -> list[_Waiting]:
    """The arrived, unfinished requests that hold no slot at ``tick``, as the policies see them."""
    return [
        _Waiting(
            r.name, arrival_index[r.name], r.priority, owed[r.name], r.tenant, tick - r.arrival
        )
        for r in reqs
        if r.arrival <= tick and owed[r.name] and r.name not in active
    ]


def _served_by_tenant(reqs: list[Request], owed: Mapping[str, int]) -> dict[str, int]:
    """Tokens emitted so far by each tenant's requests, running or finished."""
    served = {r.tenant: 0 for r in reqs}
    for r in reqs:
        served[r.tenant] += r.ticks_needed - owed[r.name]
    return served


def _run_slots(
    reqs: list[Request],
    capacity: int,
    rank: Ranking,
    refill_only_when_empty: bool,
    prefill_stalls_decode: bool,
) -> tuple[dict[str, list[int]], list[TickRecord]]:
    """The shared slot loop. Returns each request's emit ticks (end of tick) and the trace."""
    owed = {r.name: r.ticks_needed for r in reqs}
    emits: dict[str, list[int]] = {r.name: [] for r in reqs}
    active: list[str] = []
    trace: list[TickRecord] = []
    arrival_index = _arrival_order(reqs)
    tick = 0
    while any(owed.values()):
        candidates = _waiting(reqs, arrival_index, tick, owed, active)
        waiting = [w.name for w in rank(candidates, _served_by_tenant(reqs, owed))]
        admitted: list[str] = []
        if not (refill_only_when_empty and active):
            admitted = waiting[:capacity - len(active)]
        active += admitted
        emitting = admitted if (prefill_stalls_decode and admitted) else list(active)
        queued = tuple(name for name in waiting if name not in admitted)
        trace.append(TickRecord(tick, tuple(active), tuple(emitting), queued))
        for name in emitting:
            owed[name] -= 1
            emits[name].append(tick + 1)
        active = [name for name in active if owed[name]]
        tick += 1
    return emits, trace


def verify_schedule(
    reqs: Sequence[Request], capacity: int, completion: dict[str, int], trace: Sequence[TickRecord]
) -> None:
    """Check a schedule's invariants; raise ``RuntimeError`` naming the first one broken.

    Invariants: every request emits exactly ``ticks_needed`` tokens (conservation); nothing is
    active before its arrival; at most ``capacity`` requests are active per tick; a request's
    completion is the end of its last emitting tick and it holds no slot from then on.
    """
    reqs = _validate_requests(reqs)
    require_int("capacity", capacity, 1)
    by_name = {r.name: r for r in reqs}
    if set(completion) != set(by_name):
        raise RuntimeError("invariant broken: completion must name exactly the submitted requests")
    emitted = {name: 0 for name in by_name}
    last_emit = {name: 0 for name in by_name}
    for rec in trace:
        if len(rec.active) > capacity:
            raise RuntimeError(
                f"invariant broken: {len(rec.active)} active > capacity at tick {rec.tick}"
            )
        for name in rec.active:
            if rec.tick < by_name[name].arrival:
                raise RuntimeError(
                    f"invariant broken: {name} runs at tick {rec.tick} before arrival"
                )
            if rec.tick >= completion[name]:
                raise RuntimeError(f"invariant broken: {name} holds a slot after completing")
        for name in rec.emitting:
            emitted[name] += 1
            last_emit[name] = rec.tick + 1
    for name, r in by_name.items():
        if emitted[name] != r.ticks_needed:
            raise RuntimeError(
                f"invariant broken: {name} emitted {emitted[name]} of {r.ticks_needed}"
            )
        if completion[name] != last_emit[name]:
            raise RuntimeError(f"invariant broken: {name} completion is not its last emit tick")


def simulate_batching(
    reqs: Sequence[Request], capacity: int, policy: str
) -> tuple[dict[str, int], list[TickRecord]]:
    """Simulate static or continuous batching; return ``(completion, trace)``.

    ``capacity`` is the number of batch slots (int >= 1). Under ``"static"`` a batch is formed only
    when every slot is free, and a finished request's slot stays empty until the whole batch ends;
    under ``"continuous"`` a freed slot is refilled at the next tick boundary. Waiting requests are
    admitted first-come first-served. ``completion[name]`` is the tick at whose end the request
    emitted its last token; ``trace`` has one ``TickRecord`` per tick (the Gantt chart's rows).
    The invariants of ``verify_schedule`` are checked on every run.
    """
    reqs = _validate_requests(reqs)
    require_int("capacity", capacity, 1)
    if policy not in BATCHING_POLICIES:
        raise ValueError(f"policy must be one of {BATCHING_POLICIES}, got {policy!r}")
    emits, trace = _run_slots(reqs, capacity, _by_key(fcfs), policy == "static", False)
    completion = {name: times[-1] for name, times in emits.items()}
    verify_schedule(reqs, capacity, completion, trace)
    return completion, trace


def utilization(
    completion: dict[str, int], reqs: Sequence[Request], capacity: int
) -> tuple[float, dict[str, int]]:
    """Scheduler slot utilisation: serviced tokens / (capacity x makespan).

    A capacity measure inside the unit-cost tick model -- not GPU SM or HBM utilisation; real
    iterations vary in duration with batch composition. The makespan runs from the earliest arrival
    to the last completion. Returns ``(value, detail)`` with the numerator and denominator.
    """
    reqs = _validate_requests(reqs)
    require_int("capacity", capacity, 1)
    if not isinstance(completion, dict) or set(completion) != {r.name for r in reqs}:
        raise ValueError("completion must be a dict with exactly one tick per request name")
    served = sum(r.ticks_needed for r in reqs)
    makespan = max(completion.values()) - min(r.arrival for r in reqs)
    if makespan < 1:
        raise ValueError("completion ticks must lie after the arrivals (makespan >= 1)")
    slot_ticks = capacity * makespan
    return served / slot_ticks, {
        "served_tokens": served,
        "makespan": makespan,
        "slot_ticks": slot_ticks,
    }


@dataclass(frozen=True)
class QueueOutcome:
    """One request's fate under a queue policy, in ticks.

    ``wait`` = admission tick - arrival; ``ttft`` = first emit - arrival (the first token comes out
    of the admission tick's prefill); ``max_gap`` is the longest inter-token gap, None for a
    single-token request.
    """

    name: str
    arrival: int
    admitted: int
    first_token: int
    completion: int
    wait: int
    ttft: int
    max_gap: int | None


def _queue_ranking(policy: str, aging_rate: float) -> Ranking:
    if policy == "fair-queuing":
        return fair_queuing
    if policy == "sjf-aging":
        return _by_key(aging(aging_rate))
    return _by_key(POLICIES.get(policy, fcfs))  # prefill- and decode-priority admit in FCFS order


def _queue_outcomes(reqs: list[Request], emits: dict[str, list[int]],
                    trace: list[TickRecord]) -> dict[str, QueueOutcome]:
    outcomes = {}
    for r in reqs:
        times = emits[r.name]
        admitted = next(rec.tick for rec in trace if r.name in rec.active)
        gaps = itl(times)
        outcomes[r.name] = QueueOutcome(
            r.name, r.arrival, admitted, times[0], times[-1], admitted - r.arrival,
            times[0] - r.arrival, max(gaps) if gaps else None,
        )
    return outcomes


def simulate_queue_policies(
    workload: Sequence[Request], policy: str, capacity: int = 1, aging_rate: float = 1.0
) -> tuple[dict[str, QueueOutcome], list[TickRecord]]:
    """Run one queue policy on the unit-cost slot model; return per-request outcomes and the trace.

    Each tick is one iteration. An admitted request's prefill costs one tick and yields its first
    token; ``ticks_needed`` counts all its output tokens (SJF uses it as an oracle prediction of the
    output length, so under SJF the request with the long *output* is the one that starves).
    Policies:

    * ``"fcfs"`` -- free slots go to the earliest arrival (a long head request blocks the line);
    * ``"sjf"`` -- free slots go to the shortest predicted job (long jobs can starve);
    * ``"prefill-priority"`` -- FCFS admission, and a tick that admits anyone runs only those
      prefills, stalling every running decode for that tick;
    * ``"decode-priority"`` -- running decodes are never interrupted and newcomers are admitted only
      when the batch has drained, so their TTFT absorbs the wait.

    Remedies for starvation, all with mixed iterations like FCFS and SJF:

    * ``"sjf-aging"`` -- SJF on the predicted length minus ``aging_rate`` tokens (a real >= 0) per
      tick already waited, so a long job's rank improves while it waits;
    * ``"priority"`` -- strict priority classes: lowest ``Request.priority`` first, FCFS inside a
      class (a remedy only for the class on top; a low class can starve the same way);
    * ``"fair-queuing"`` -- per-tenant fair queuing: the tenant served the fewest tokens so far gets
      the next slot, FCFS inside a tenant (see ``Request.tenant``).
    """
    reqs = _validate_requests(workload)
    require_int("capacity", capacity, 1)
    if policy not in QUEUE_POLICIES:
        raise ValueError(f"policy must be one of {QUEUE_POLICIES}, got {policy!r}")
    require_real("aging_rate", aging_rate, 0.0)
    emits, trace = _run_slots(reqs, capacity, _queue_ranking(policy, aging_rate),
                              policy == "decode-priority", policy == "prefill-priority")
    completion = {name: times[-1] for name, times in emits.items()}
    verify_schedule(reqs, capacity, completion, trace)
    return _queue_outcomes(reqs, emits, trace), trace


@dataclass(frozen=True)
class PrefillRequest:
    """A request in the token-budget iteration model.

    ``prompt_tokens`` must be prefilled before the first output token; 0 marks a stream that is
    already decoding when the window opens (its previous token left at ``arrival``).
    ``output_tokens`` (>= 1) counts every token it emits, the first included.
    """

    name: str
    arrival: int
    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        require_name("name", self.name)
        require_int("arrival", self.arrival, 0)
        require_int("prompt_tokens", self.prompt_tokens, 0)
        require_int("output_tokens", self.output_tokens, 1)


@dataclass(frozen=True)
class Iteration:
    """One engine iteration: its time span in ticks, decode streams and prefill chunk sizes."""

    start: Fraction
    end: Fraction
    decodes: tuple[str, ...]
    prefill_chunks: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class IterationTrace:
    """Result of ``simulate_iterations``: emit times per request (ticks) and the iterations."""

    emit_times: dict[str, tuple[Fraction, ...]]
    iterations: tuple[Iteration, ...]
    requests: tuple[PrefillRequest, ...]

    def ttft(self, name: str) -> Fraction:
        """Ticks from the request's arrival to its first token (needs ``prompt_tokens`` >= 1)."""
        r = next((r for r in self.requests if r.name == name), None)
        if r is None or r.prompt_tokens == 0:
            raise ValueError(f"name must be a request with a prompt to prefill, got {name!r}")
        return self.emit_times[name][0] - r.arrival

    def max_decode_gap(self) -> Fraction:
        """Longest gap between consecutive tokens of any stream (ticks), the stall users see.

        Streams already decoding at the window's start count their previous token at ``arrival``.
        """
        gaps: list[Fraction] = [Fraction(0)]
        for r in self.requests:
            times = list(self.emit_times[r.name])
            if r.prompt_tokens == 0:
                times.insert(0, Fraction(r.arrival))
            gaps += itl(times)
        return max(gaps)


def simulate_iterations(
    requests: Sequence[PrefillRequest], tokens_per_tick: int, token_budget: int | None = None
) -> IterationTrace:
    """Simulate mixed prefill/decode iterations under a token-cost model.

    Cost model: the engine processes ``tokens_per_tick`` tokens per tick, so an iteration holding
    n tokens (decode tokens plus prefill tokens) lasts n / tokens_per_tick ticks, and every token it
    produces is emitted at its end. Every running stream contributes one decode token to each
    iteration (decodes first). ``token_budget=None`` is unchunked prefill: each arrived prompt's
    whole remaining prefill joins the next iteration. An int ``token_budget`` caps an iteration's
    total tokens; prefill gets what the decodes leave, split first-come first-served, so a long
    prompt is chunked across iterations. A prompt's first token is sampled from its last prefill
    chunk. Time advances to the next arrival when nothing is runnable.
    """
    if not isinstance(requests, (list, tuple)) or not all(
        isinstance(r, PrefillRequest) for r in requests
    ):
        raise TypeError("requests must be a list or tuple of PrefillRequest")
    if not requests:
        raise ValueError("requests must contain at least one PrefillRequest")
    reqs = list(requests)
    if len({r.name for r in reqs}) != len(reqs):
        raise ValueError("requests must have unique names")
    require_int("tokens_per_tick", tokens_per_tick, 1)
    if token_budget is not None:
        require_int("token_budget", token_budget, 1)

    prefill_left = {r.name: r.prompt_tokens for r in reqs}
    owed = {r.name: r.output_tokens for r in reqs}
    emits: dict[str, list[Fraction]] = {r.name: [] for r in reqs}
    iterations: list[Iteration] = []
    now = Fraction(0)
    while any(owed.values()):
        arrived = [r for r in reqs if r.arrival <= now and owed[r.name]]
        decodes = [r.name for r in arrived if prefill_left[r.name] == 0]
        room = math.inf if token_budget is None else max(token_budget - len(decodes), 0)
        chunks: list[tuple[str, int]] = []
        for r in sorted((r for r in arrived if prefill_left[r.name]), key=lambda r: r.arrival):
            take = int(min(prefill_left[r.name], room))
            if take:
                chunks.append((r.name, take))
                room -= take
        if not decodes and not chunks:
            now = Fraction(min(r.arrival for r in reqs if owed[r.name] and r.arrival > now))
            continue
        end = now + Fraction(len(decodes) + sum(n for _, n in chunks), tokens_per_tick)
        for name, n in chunks:
            prefill_left[name] -= n
        finished_prefill = [name for name, _ in chunks if prefill_left[name] == 0]
        for name in decodes + finished_prefill:
            owed[name] -= 1
            emits[name].append(end)
        iterations.append(Iteration(now, end, tuple(decodes), tuple(chunks)))
        now = end
    return IterationTrace(
        {name: tuple(times) for name, times in emits.items()}, tuple(iterations), tuple(reqs)
    )


@dataclass(frozen=True)
class PrefillScenario:
    """A chunked-prefill experiment: the workload, the engine rate and the chunked budget."""

    requests: tuple[PrefillRequest, ...]
    tokens_per_tick: int
    chunked_budget: int
    long_prompt: str


def chunked_prefill_scenario() -> PrefillScenario:
    """The book's chunked-prefill trade-off: max decode gap 3 -> 1, long-prompt TTFT 3 -> 4.

    Stream ``S`` is already decoding (6 tokens left); prompt ``L`` of 8 tokens arrives at tick 0;
    the engine processes 3 tokens per tick.

    * Unchunked: the first iteration holds S's decode token plus all 8 prompt tokens, 9 tokens =
      3 ticks, so S waits 3 ticks for its next token and L's first token appears at tick 3.
    * Budget 3: each iteration holds S's token plus a 2-token chunk (1 tick); L needs 8 / 2 = 4
      iterations, so S's gap is 1 tick but L's first token slips to tick 4.
    """
    return PrefillScenario(
        requests=(PrefillRequest("S", 0, 0, 6), PrefillRequest("L", 0, 8, 2)),
        tokens_per_tick=3,
        chunked_budget=3,
        long_prompt="L",
    )
