"""Checker for the continuous-batching exercise: one scheduler tick.

Student signature::

    def tick(running: dict[str, int], queue: list[tuple[str, int]], capacity: int
             ) -> tuple[dict[str, int], list[tuple[str, int]], list[str]]: ...

``running`` maps each active request to the tokens it still owes; ``queue`` holds waiting ``(name,
tokens_needed)`` pairs, first come first served. One tick (1) moves requests from the head of the
queue into free slots, (2) lets every running request emit one token, (3) removes the ones that now
owe nothing. It returns the new ``running``, the new ``queue`` and the names that finished this
tick, in running order. The checker compares single ticks with their expected results (written here
for the public cases, computed by the instructor-only reference for hidden ones), then drives a
submission tick by tick and compares completion times with
``servelab.scheduling.batching.simulate_batching(..., policy="continuous")``.
"""

from __future__ import annotations

from collections.abc import Callable

from servelab.scheduling.batching import Request, simulate_batching
from servelab.exercises.expected import reference
from servelab.exercises.hidden import hidden_rng, renamer
from servelab.exercises.result import Case, CaseFailure, CheckResult, run_cases

__all__ = ["check_batching_tick", "run_ticks"]

Tick = Callable[
    [dict[str, int], list[tuple[str, int]], int],
    tuple[dict[str, int], list[tuple[str, int]], list[str]],
]


def run_ticks(
    tick: Tick, requests: list[Request], capacity: int, max_ticks: int = 1_000
) -> dict[str, int]:
    """Drive ``tick`` from t = 0 with requests joining the queue at their arrival; return completion
    ticks."""
    running: dict[str, int] = {}
    queue: list[tuple[str, int]] = []
    completion: dict[str, int] = {}
    for t in range(max_ticks):
        queue += [(r.name, r.ticks_needed) for r in requests if r.arrival == t]
        running, queue, finished = tick(dict(running), list(queue), capacity)
        completion.update({name: t + 1 for name in finished})
        if len(completion) == len(requests):
            return completion
    raise CaseFailure(
        f"not every request finished within {max_ticks} ticks: {sorted(completion)} did"
    )


SINGLE_TICKS = (
    ("a finished request leaves at the end of its tick",
     ({"A": 1, "B": 3}, [("C", 2)], 2), ({"B": 2}, [("C", 2)], ["A"])),
    ("a free slot is refilled before the tick runs",
     ({"B": 2}, [("C", 2), ("D", 1)], 2), ({"B": 1, "C": 1}, [("D", 1)], [])),
    ("admission stops at capacity",
     ({}, [("A", 2), ("B", 2), ("C", 2)], 2), ({"A": 1, "B": 1}, [("C", 2)], [])),
    ("an admitted one-token request finishes in the same tick",
     ({"B": 4}, [("C", 1)], 2), ({"B": 3}, [], ["C"])),
)

SIMULATIONS = (
    (
        "A/B/C, two slots (the chapter's example)",
        [Request("A", 0, 1), Request("B", 0, 4), Request("C", 0, 1)],
        2,
    ),
    (
        "staggered arrivals",
        [Request("A", 0, 3), Request("B", 1, 2), Request("C", 1, 4), Request("D", 5, 1)],
        2,
    ),
    ("equal lengths", [Request("A", 0, 3), Request("B", 0, 3)], 2),
)


def hidden_cases(seed: int) -> tuple[tuple, tuple]:
    """``(single ticks, simulations)`` for ``seed``: the single ticks with fresh names and 0-3 more
    tokens owed by every request that does not finish in the tick (expected values from the
    reference tick), and seeded random workloads under the simulations' titles."""
    rng, reference_tick = hidden_rng(seed, "batching_tick"), reference().reference_tick
    singles = []
    for rule, (running, queue, capacity), _ in SINGLE_TICKS:
        names = renamer(rng, [*running, *(n for n, _ in queue)])
        more = {n: rng.randint(0, 3) for n in names}
        running = {names[n]: left + (more[n] if left > 1 else 0) for n, left in running.items()}
        queue = [(names[n], left + (more[n] if left > 1 else 0)) for n, left in queue]
        singles.append(
            (rule, (running, queue, capacity), reference_tick(dict(running), list(queue), capacity))
        )
    sims = []
    for rule, requests, capacity in SIMULATIONS:
        names, shift, extra = (
            renamer(rng, [r.name for r in requests]),
            rng.randint(0, 2),
            rng.randint(0, 2),
        )
        sims.append(
            (
                rule,
                [
                    Request(names[r.name], r.arrival + shift, r.ticks_needed + extra)
                    for r in requests
                ],
                capacity,
            )
        )
    return tuple(singles), tuple(sims)


def _single(tick: Tick, args: tuple, expected: tuple) -> None:
    running, queue, capacity = args
    got = tick(dict(running), list(queue), capacity)
    got_norm = (dict(got[0]), [tuple(x) for x in got[1]], list(got[2]))
    if got_norm != expected:
        raise CaseFailure(
            f"tick(running={running}, queue={queue}, capacity={capacity}) returned "
            f"{got_norm}, expected {expected}"
        )


def _simulation(tick: Tick, requests: list[Request], capacity: int) -> None:
    expected, _ = simulate_batching(requests, capacity, "continuous")
    got = run_ticks(tick, requests, capacity)
    if got != expected:
        arrivals = ", ".join(
            f"{r.name} at t={r.arrival} needing {r.ticks_needed}" for r in requests
        )
        raise CaseFailure(
            f"requests {arrivals}, {capacity} slots: completion ticks {got}, expected {expected} "
            "(continuous batching refills freed slots)"
        )


def check_batching_tick(tick: Tick, verbose: bool = True, seed: int | None = None) -> CheckResult:
    """Run the single-tick cases and full simulations (public, or the hidden ones of ``seed``)."""
    singles, sims = (SINGLE_TICKS, SIMULATIONS) if seed is None else hidden_cases(seed)
    cases = [Case(rule, lambda a=args, e=exp: _single(tick, a, e)) for rule, args, exp in singles]
    cases += [
        Case(rule, lambda r=reqs, c=cap: _simulation(tick, r, c), 2) for rule, reqs, cap in sims
    ]
    return run_cases("continuous-batching tick", cases, verbose)


def worked_example() -> str:
    """The second single-tick case: a freed slot is refilled before the tick runs."""
    _, (running, queue, capacity), out = SINGLE_TICKS[1]
    return f"tick({running}, {queue}, capacity={capacity})\n-> {out}"
