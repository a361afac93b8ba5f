"""Checkers for the sampling exercises: top-p and min-p.

Student signatures (probabilities in, renormalised probabilities out, exact zeros outside the kept
set)::

    def top_p(probs: np.ndarray, p: float) -> np.ndarray: ...
    def min_p(probs: np.ndarray, alpha: float) -> np.ndarray: ...

The references are ``servelab.sampling.top_p_filter`` and ``servelab.sampling.min_p_filter``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from servelab.exercises.hidden import hidden_rng
from servelab.exercises.result import Case, CaseFailure, CheckResult, run_cases
from servelab.sampling import min_p_filter, softmax, top_p_filter

__all__ = ["check_min_p", "check_top_p"]

Filter = Callable[[np.ndarray, float], np.ndarray]

TOP_P_CASES = (
    ("the token whose cumulative mass crosses p is kept", [0.4, 0.3, 0.2, 0.1], 0.65),
    ("cumulative mass lands exactly on p", [0.5, 0.25, 0.25], 0.75),
    ("unsorted input", [0.1, 0.6, 0.3], 0.65),
    ("the top token alone reaches p", [0.9, 0.06, 0.04], 0.5),
    ("p = 1 keeps the whole support", [0.7, 0.2, 0.1], 1.0),
    ("masked tokens stay at zero", [0.0, 0.5, 0.3, 0.2], 0.9),
    ("ties broken by the smaller id", [0.4, 0.2, 0.2, 0.2], 0.5),
)

MIN_P_CASES = (
    ("the threshold is alpha times the top probability", [0.5, 0.3, 0.15, 0.05], 0.3),
    ("flat distribution keeps everything", [0.25, 0.25, 0.25, 0.25], 0.9),
    ("peaked distribution keeps one token", [0.05, 0.9, 0.05], 0.1),
    ("alpha = 0 keeps the whole support", [0.6, 0.3, 0.1], 0.0),
    ("masked tokens stay at zero", [0.0, 0.45, 0.35, 0.2], 0.5),
    ("flattened by temperature 2", softmax(np.array([3.0, 2.0, 1.0, 0.0]) / 2.0).tolist(), 0.4),
)


def hidden_cases(table: tuple, seed: int, checker: str) -> tuple:
    """``table``'s rules on new inputs: the tokens permuted and 1-3 masked (zero) tokens inserted.

    Every rule survives both moves: ties stay ties (the reference still breaks them by the smaller
    id), sorted input becomes unsorted only where the rule does not care.
    """
    rng = hidden_rng(seed, checker)
    cases = []
    for rule, probs, value in table:
        probs = list(probs) + [0.0] * rng.randint(1, 3)
        rng.shuffle(probs)
        cases.append((rule, probs, value))
    return tuple(cases)


def _support(probs: np.ndarray) -> list[int]:
    return [int(i) for i in np.flatnonzero(probs > 0)]


def _compare(
    name: str, fn: Filter, reference: Filter, probs: list[float], arg: str, value: float
) -> None:
    """Raise CaseFailure when ``fn`` keeps a different set or returns unnormalised probabilities."""
    given = np.array(probs, dtype=float)
    expected = reference(given.copy(), value)
    got = np.asarray(fn(given.copy(), value), dtype=float)
    call = f"{name}({probs}, {arg}={value:g})"
    if got.shape != expected.shape:
        raise CaseFailure(f"{call} returned shape {got.shape}, expected {expected.shape}")
    if _support(got) != _support(expected):
        raise CaseFailure(f"{call} kept tokens {_support(got)}, expected {_support(expected)}")
    if not np.allclose(got, expected, atol=1e-9):
        raise CaseFailure(
            f"{call} kept the right tokens but returned {np.round(got, 4).tolist()}, expected "
            f"{np.round(expected, 4).tolist()} (renormalise over the kept tokens)"
        )


def check_top_p(top_p: Filter, verbose: bool = True, seed: int | None = None) -> CheckResult:
    """Run the top-p cases (public, or the hidden ones of ``seed``) against
    ``servelab.sampling.top_p_filter``."""
    table = TOP_P_CASES if seed is None else hidden_cases(TOP_P_CASES, seed, "top_p")
    cases = [
        Case(rule, lambda probs=probs, p=p: _compare("top_p", top_p, top_p_filter, probs, "p", p))
        for rule, probs, p in table
    ]
    return run_cases("top-p", cases, verbose)


def check_min_p(min_p: Filter, verbose: bool = True, seed: int | None = None) -> CheckResult:
    """Run the min-p cases (public, or the hidden ones of ``seed``) against
    ``servelab.sampling.min_p_filter``."""
    table = MIN_P_CASES if seed is None else hidden_cases(MIN_P_CASES, seed, "min_p")
    cases = [
        Case(
            rule, lambda probs=probs, a=a: _compare("min_p", min_p, min_p_filter, probs, "alpha", a)
        )
        for rule, probs, a in table
    ]
    return run_cases("min-p", cases, verbose)


def _rounded(values: np.ndarray) -> list[float]:
    return [round(float(v), 4) for v in values]


def worked_example() -> str:
    """The first case of each filter on the reference, rounded to 4 decimals."""
    (_, probs_p, p), (_, probs_m, alpha) = TOP_P_CASES[0], MIN_P_CASES[0]
    top = top_p_filter(np.array(probs_p), p)
    low = min_p_filter(np.array(probs_m), alpha)
    return (f"top_p({probs_p}, p={p}) -> {_rounded(top)}\n"
            f"min_p({probs_m}, alpha={alpha}) -> {_rounded(low)}")
