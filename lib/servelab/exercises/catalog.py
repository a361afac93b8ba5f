"""The exercise notebooks, what each asks the student to define, and the checker that grades it.

One :class:`Exercise` per notebook of ``notebooks/exercises/``, keyed by the notebook's stem. The
batch grader (``python -m servelab_instructor.grader grade``) uses it to know which names to read
from a student's executed notebook; :func:`worked_example` gives each notebook its worked expected
output, from the public cases' expected values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from servelab.exercises import (
    admission,
    attention,
    kv,
    metrics,
    sampling,
    scheduling,
    sizing,
    speculative,
    streaming,
    tick,
)
from servelab.exercises.result import CheckResult

__all__ = ["EXERCISES", "Exercise", "exercise_for", "worked_example"]


@dataclass(frozen=True)
class Exercise:
    """One notebook: ``checks`` pairs each checker with the student names it is called with, in
    order; ``allowed`` maps each ``servelab`` module graded code may import to the names it may take
    from it (the grader's worker provides stand-ins for them; every other ``servelab`` import is
    refused)."""

    stem: str
    title: str
    checks: tuple[tuple[Callable[..., CheckResult], tuple[str, ...]], ...]
    example: Callable[[], str]
    allowed: dict[str, list[str]] = field(default_factory=dict)


EXERCISES: dict[str, Exercise] = {
    e.stem: e
    for e in (
        Exercise(
            "ex01-sampling-filters",
            "top-p and min-p",
            ((sampling.check_top_p, ("top_p",)), (sampling.check_min_p, ("min_p",))),
            sampling.worked_example,
        ),
        Exercise(
            "ex02-stop-buffer",
            "the stop-string buffer",
            ((streaming.check_stop_buffer, ("StopBuffer",)),),
            streaming.worked_example,
        ),
        Exercise(
            "ex03-block-allocator",
            "paged KV blocks with refcounts",
            ((kv.check_block_allocator, ("Allocator",)),),
            kv.worked_example,
        ),
        Exercise(
            "ex04-batching-tick",
            "one continuous-batching tick",
            ((scheduling.check_batching_tick, ("tick",)),),
            scheduling.worked_example,
        ),
        Exercise(
            "ex05-goodput",
            "goodput",
            ((metrics.check_goodput, ("goodput",)),),
            metrics.worked_example,
            {"servelab.metrics.latency": ["RequestTiming"]},
        ),
        Exercise(
            "ex06-speculative",
            "the speculative accept/correct rule",
            ((speculative.check_speculative, ("accept_probability", "residual")),),
            speculative.worked_example,
        ),
        Exercise(
            "ex07-kv-sizing",
            "KV bytes per token and requests per pool",
            ((sizing.check_kv_sizing, ("kv_bytes_per_token", "max_requests")),),
            sizing.worked_example,
        ),
        Exercise(
            "ex08-admission",
            "admission with KV reservations",
            ((admission.check_admission, ("admit",)),),
            admission.worked_example,
        ),
        Exercise(
            "ex09-paged-attention",
            "attention through a block table",
            ((attention.check_paged_attention, ("paged_attention",)),),
            attention.worked_example,
        ),
        Exercise(
            "ex10-scheduler-tick",
            "one scheduler tick: token budget, block budget, chunked prefill",
            ((tick.check_scheduler_tick, ("schedule",)),),
            tick.worked_example,
        ),
    )
}


def exercise_for(stem: str) -> Exercise:
    """The exercise of a notebook stem such as ``"ex03-block-allocator"``; ValueError if unknown."""
    if stem not in EXERCISES:
        raise ValueError(f"stem must be one of {sorted(EXERCISES)}, got {stem!r}")
    return EXERCISES[stem]


def worked_example(stem: str) -> str:
    """The notebook's worked example: a call and what a correct solution returns."""
    return exercise_for(stem).example()
