"""Result objects and the case runner shared by every exercise checker.

A checker runs named cases against a student's function or class. Each case compares the student's
answer with the reference implementation in ``servelab`` and raises :class:`CaseFailure` with a
sentence saying what differed. The runner turns that into a :class:`CheckResult`, prints a short
report, and never raises itself: a student stub that still raises ``NotImplementedError`` is reported
as "not implemented yet", any other exception as a failed case naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["CaseFailure", "CaseResult", "CheckResult", "run_cases"]


class CaseFailure(AssertionError):
    """A case's answer differs from the reference; the message says how."""


@dataclass(frozen=True)
class CaseResult:
    """Outcome of one hidden case: ``detail`` explains a failure and is empty on success."""

    name: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one checker run.

    ``passed`` is True only when the submission is implemented and every case passed.
    ``not_implemented`` is True when the submission raised ``NotImplementedError`` (the stub as shipped).
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

    def report(self) -> str:
        """A few lines a student can act on: one per case, then a summary."""
        if self.not_implemented:
            return f"{self.exercise}: not implemented yet (the stub raises NotImplementedError)."
        lines = [f"  {'ok  ' if c.passed else 'FAIL'} {c.name}" + (f": {c.detail}" if c.detail else "")
                 for c in self.cases]
        verdict = "all cases passed" if self.passed else f"{len(self.failures)} of {len(self.cases)} cases failed"
        return "\n".join([f"{self.exercise}: {verdict}", *lines])

    def __str__(self) -> str:
        return self.report()


Case = tuple[str, Callable[[], None]]


def run_cases(exercise: str, cases: Sequence[Case], verbose: bool = True) -> CheckResult:
    """Run every case, collect the outcomes, print the report when ``verbose``; never raises."""
    results: list[CaseResult] = []
    for name, case in cases:
        try:
            case()
        except NotImplementedError:
            result = CheckResult(exercise, tuple(results), not_implemented=True)
            break
        except CaseFailure as failure:
            results.append(CaseResult(name, False, str(failure)))
        except Exception as exc:  # a student's bug is a failed case, not a crash of the checker
            results.append(CaseResult(name, False, f"raised {type(exc).__name__}: {exc}"))
        else:
            results.append(CaseResult(name, True))
    else:
        result = CheckResult(exercise, tuple(results))
    if verbose:
        print(result.report())
    return result
