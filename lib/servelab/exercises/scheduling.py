"""Checker for the continuous-batching exercise: one scheduler tick.

Student signature::

    def tick(running: dict[str, int], queue: list[tuple[str, int]], capacity: int
             ) -> tuple[dict[str, int], list[tuple[str, int]], list[str]]: ...

``running`` maps each active request to the tokens it still owes; ``queue`` holds waiting
``(name, tokens_needed)`` pairs, first come first served. One tick (1) moves requests from the head of
the queue into free slots, (2) lets every running request emit one token, (3) removes the ones that
now owe nothing. It returns the new ``running``, the new ``queue`` and the names that finished this
tick, in running order. The checker compares single ticks with the reference (the checkers' private
module), then drives a submission tick by tick and compares completion times with
``servelab.batching.simulate_batching(..., policy="continuous")``.
"""

from __future__ import annotations

from collections.abc import Callable

from servelab.batching import Request, simulate_batching
from servelab.exercises._reference import reference_tick
from servelab.exercises.result import Case, CaseFailure, CheckResult, run_cases

__all__ = ["check_batching_tick", "run_ticks"]

Tick = Callable[[dict[str, int], list[tuple[str, int]], int], tuple[dict[str, int], list[tuple[str, int]], list[str]]]


def run_ticks(tick: Tick, requests: list[Request], capacity: int, max_ticks: int = 1_000) -> dict[str, int]:
    """Drive ``tick`` from t = 0 with requests joining the queue at their arrival; return completion ticks."""
    running: dict[str, int] = {}
    queue: list[tuple[str, int]] = []
    completion: dict[str, int] = {}
    for t in range(max_ticks):
        queue += [(r.name, r.ticks_needed) for r in requests if r.arrival == t]
        running, queue, finished = tick(dict(running), list(queue), capacity)
        completion.update({name: t + 1 for name in finished})
        if len(completion) == len(requests):
            return completion
    raise CaseFailure(f"not every request finished within {max_ticks} ticks: {sorted(completion)} did")


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
    ("A/B/C, two slots (the chapter's example)",
     [Request("A", 0, 1), Request("B", 0, 4), Request("C", 0, 1)], 2),
    ("staggered arrivals", [Request("A", 0, 3), Request("B", 1, 2), Request("C", 1, 4), Request("D", 5, 1)], 2),
    ("equal lengths", [Request("A", 0, 3), Request("B", 0, 3)], 2),
)


def _single(tick: Tick, args: tuple, expected: tuple) -> None:
    running, queue, capacity = args
    got = tick(dict(running), list(queue), capacity)
    got_norm = (dict(got[0]), [tuple(x) for x in got[1]], list(got[2]))
    if got_norm != expected:
        raise CaseFailure(
            f"tick(running={running}, queue={queue}, capacity={capacity}) returned {got_norm}, expected {expected}"
        )


def _simulation(tick: Tick, requests: list[Request], capacity: int) -> None:
    expected, _ = simulate_batching(requests, capacity, "continuous")
    got = run_ticks(tick, requests, capacity)
    if got != expected:
        arrivals = ", ".join(f"{r.name} at t={r.arrival} needing {r.ticks_needed}" for r in requests)
        raise CaseFailure(f"requests {arrivals}, {capacity} slots: completion ticks {got}, expected {expected} "
                          "(continuous batching refills freed slots)")


def check_batching_tick(tick: Tick, verbose: bool = True) -> CheckResult:
    """Run the hidden single-tick cases and full simulations against continuous batching."""
    cases = [Case(rule, lambda a=args, e=exp: _single(tick, a, e)) for rule, args, exp in SINGLE_TICKS]
    cases += [Case(rule, lambda r=reqs, c=cap: _simulation(tick, r, c), 2) for rule, reqs, cap in SIMULATIONS]
    return run_cases("continuous-batching tick", cases, verbose)


def worked_example() -> str:
    """The second single-tick case on the reference: a freed slot is refilled before the tick runs."""
    running, queue, capacity = SINGLE_TICKS[1][1]
    out = reference_tick(dict(running), list(queue), capacity)
    return f"tick({running}, {queue}, capacity={capacity})\n-> {out}"
