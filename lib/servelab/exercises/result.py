"""Cases, results and the case runner shared by every exercise checker.

A checker runs hidden :class:`Case` objects against a student's function or class. Each case is
titled by the *rule* it tests ("a shared block returns only with its last holder"), is worth a
number of points, and compares the student's answer with the reference; on a difference it raises
:class:`CaseFailure` with a sentence saying what went in, what came out, what was expected and, for
a multi-step case, the steps that led there. The runner turns that into a :class:`CheckResult`,
prints a short report, and never raises itself: a student stub that still raises
``NotImplementedError`` is reported as "not implemented yet" (every case scores 0), any other
exception as a failed case naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["Case", "CaseFailure", "CaseResult", "CheckResult", "observing_cases", "run_cases"]

_OBSERVER: ContextVar[Callable[[str], None] | None] = ContextVar(
    "servelab_case_observer", default=None
)


@contextmanager
def observing_cases(callback: Callable[[str], None]) -> Iterator[None]:
    """Call ``callback(rule)`` before each case that :func:`run_cases` runs in this context (the
    grader's
    hook: it starts a fresh call log and time budget per case)."""
    token = _OBSERVER.set(callback)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


class CaseFailure(AssertionError):
    """A case's answer differs from the reference; the message says how.

    ``feedback`` is what a student may see of a *hidden* case (the rule broken, the input, what was
    returned, never the expected value); empty when the checker has nothing beyond its call log.
    """

    def __init__(self, message: str, feedback: str = "") -> None:
        super().__init__(message)
        self.feedback = feedback


@dataclass(frozen=True)
class Case:
    """One hidden case: ``rule`` is its title (the rule it tests), ``run`` raises on a wrong
    answer."""

    rule: str
    run: Callable[[], None]
    points: int = 1


@dataclass(frozen=True)
class CaseResult:
    """Outcome of one hidden case: ``detail`` explains a failure and is empty on success."""

    name: str
    passed: bool
    detail: str = ""
    max_points: int = 1
    feedback: str = ""

    @property
    def points(self) -> int:
        """Points earned: all of ``max_points`` on a pass, none on a failure."""
        return self.max_points if self.passed else 0


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one checker run.

    ``passed`` is True only when the submission is implemented and every case passed.
    ``not_implemented`` is True when the submission raised ``NotImplementedError`` (the stub as
    shipped); ``cases`` then lists every case with 0 points, so a grade sheet still shows what was
    possible.
    """

    exercise: str
    cases: tuple[CaseResult, ...]
    not_implemented: bool = False

    @property
    def passed(self) -> bool:
        return not self.not_implemented and bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def failures(self) -> tuple[CaseResult, ...]:
        """The cases that failed, in the order they ran."""
        return tuple(c for c in self.cases if not c.passed)

    @property
    def points(self) -> int:
        return sum(c.points for c in self.cases)

    @property
    def max_points(self) -> int:
        return sum(c.max_points for c in self.cases)

    def report(self) -> str:
        """A few lines a student can act on: one per case (rule, points, what went wrong), then a
        summary."""
        if self.not_implemented:
            return (f"{self.exercise}: not implemented yet (the stub raises NotImplementedError); "
                    f"0 of {self.max_points} points.")
        lines = []
        for c in self.cases:
            lines.append(
                f"  {'ok  ' if c.passed else 'FAIL'} [{c.points}/{c.max_points}] rule: {c.name}"
            )
            lines += [f"         {line}" for line in c.detail.splitlines()]
        verdict = (
            "all cases passed"
            if self.passed
            else f"{len(self.failures)} of {len(self.cases)} cases failed"
        )
        return "\n".join(
            [f"{self.exercise}: {verdict}; {self.points} of {self.max_points} points", *lines]
        )

    def __str__(self) -> str:
        return self.report()


def _outcome(case: Case) -> CaseResult | None:
    """Run one case; None when the submission is still the stub (NotImplementedError)."""
    try:
        case.run()
    except NotImplementedError:
        return None
    except CaseFailure as failure:
        return CaseResult(case.rule, False, str(failure), case.points, failure.feedback)
    except Exception as exc:  # a student's bug is a failed case, not a crash of the checker
        return CaseResult(case.rule, False, f"raised {type(exc).__name__}: {exc}", case.points)
    return CaseResult(case.rule, True, "", case.points)


def run_cases(exercise: str, cases: Sequence[Case], verbose: bool = True) -> CheckResult:
    """Run every case, collect the outcomes, print the report when ``verbose``; never raises."""
    results: list[CaseResult] = []
    observer = _OBSERVER.get()
    for case in cases:
        if observer is not None:
            observer(case.rule)
        outcome = _outcome(case)
        if outcome is None:
            unscored = tuple(
                CaseResult(c.rule, False, "not implemented yet", c.points) for c in cases
            )
            result = CheckResult(exercise, unscored, not_implemented=True)
            break
        results.append(outcome)
    else:
        result = CheckResult(exercise, tuple(results))
    if verbose:
        print(result.report())
    return result
