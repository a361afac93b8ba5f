"""The grader never fails correct work: every exercise's solution scores full points under 200 secret
seeds, with every argument and answer sent through the worker's wire format as a graded submission's are.

The checkers run in this process on proxies that encode each argument to JSON and decode it, call the
solution, and send its answer back the same way (what :mod:`servelab_instructor.grader.sandbox` does across the
worker's pipes), so a value the wire changes would show up here. The worker process itself is covered
by tests/test_grading.py.
"""

from __future__ import annotations

import json
import random

import pytest

from servelab.exercises import tick
from servelab_instructor.grader._worker import decode, encode
from servelab.exercises.catalog import EXERCISES
from servelab_instructor.grader.grade import _note
from servelab_instructor.grader.sandbox import CaseLog
from servelab_instructor.solutions import SOLUTIONS, reference_schedule

# 200 secret seeds: the three that once failed the scheduler tick's reference, and 197 drawn at random.
SEEDS = [3, 777, 20261206, *random.Random(37).sample(range(2**31), 197)]


def _wire(value: object) -> object:
    return decode(json.loads(json.dumps(encode(value))))


class _Remote:
    """An instance of a solution's class reached through the wire, as the grader reaches a student's."""

    def __init__(self, target: object) -> None:
        self._target = target

    def __getattr__(self, name: str) -> object:
        value = getattr(self._target, name)
        if callable(value):
            return lambda *args: _wire(value(*(_wire(a) for a in args)))
        return _wire(value)


def _through_wire(solution: object) -> object:
    if isinstance(solution, type):
        return lambda *args: _Remote(solution(*(_wire(a) for a in args)))
    return lambda *args: _wire(solution(*(_wire(a) for a in args)))


def test_every_exercise_has_a_solution():
    assert sorted(SOLUTIONS) == sorted(EXERCISES)
    for stem, exercise in EXERCISES.items():
        assert len(SOLUTIONS[stem]) == sum(len(names) for _, names in exercise.checks), stem


@pytest.mark.parametrize("stem", sorted(EXERCISES))
def test_the_solution_scores_full_points_under_200_seeds(stem):
    exercise, solution = EXERCISES[stem], [_through_wire(s) for s in SOLUTIONS[stem]]
    failed = []
    for seed in SEEDS:
        given = iter(solution)
        for check, names in exercise.checks:
            result = check(*[next(given) for _ in names], verbose=False, seed=seed)
            if result.points != result.max_points or result.not_implemented:
                failed.append((seed, result.report()))
    assert not failed, f"{len(failed)} of {len(SEEDS)} seeds fail correct work; first:\n{failed[0]}"


def test_a_stalled_workload_ends_with_a_correct_empty_tick():
    # Two running sequences each need a block, none is free, and the queue's head needs more than the pool.
    requests = [("a", 0, 4, 3), ("b", 0, 4, 3), ("c", 1, 30, 2)]
    ticks = tick.run_workload(reference_schedule, requests, pool_blocks=2, block_size=4, token_budget=8,
                              max_num_seqs=4)
    assert ticks == 2  # tick 0 fills both blocks, tick 1 has nothing the rule allows
    with pytest.raises(tick.CaseFailure, match="work conservation"):  # an empty plan while work fits fails
        tick.run_workload(lambda *args: [], requests, 2, 4, 8, 4)


def test_hidden_feedback_names_the_rule_the_tick_the_call_and_the_return_once():
    def lazy(running, waiting, *rest):  # correct, except that it never admits the third request
        return [p for p in reference_schedule(running, waiting, *rest) if p[0] != "r2"]

    result = tick.check_scheduler_tick(lazy, verbose=False, seed=20261206)
    failed = [c for c in result.cases if not c.passed]
    assert failed and all(c.feedback for c in failed)
    calls = ["schedule(running=[], ...) returned [('r0', 4)]"] * 480
    note = _note(CaseLog(calls=calls), failed[-1].detail, failed[-1].feedback)
    assert "the plan breaks the rule: " in note and "tick " in note and "returned [" in note
    assert "expected" not in note and note.count("returned") == 1
    plain = _note(CaseLog(calls=calls), "")
    assert plain == f"{calls[0]} (480 identical calls)"
