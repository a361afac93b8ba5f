"""Checker for the speculative-decoding exercise: the accept/correct rule, checked for exactness.

Student signatures (probability vectors over one vocabulary in, a probability or a vector out)::

    def accept_probability(p: np.ndarray, q: np.ndarray, token: int) -> float: ...
    def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray: ...

``p`` is the target's distribution, ``q`` the draft's, ``token`` a draft token drawn from ``q``. The
reference is ``servelab.optimizations.speculative`` (``acceptance_probability``,
``residual_distribution``); the public cases' expected values are committed data
(:mod:`servelab.exercises.expected`).

Exactness is checked by enumeration, not by sampling: for every pair ``(p, q)`` of a case the
checker builds the distribution of the emitted token from the student's two functions,
``P(y) = q(y) a(y) + (sum_x q(x) (1 - a(x))) r(y)``, and requires it to equal ``p`` to 1e-9. Only
tokens with ``q(x) > 0`` are ever drafted, so ``accept_probability`` is called on those alone, and
``residual`` only when a rejection is possible.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from servelab.exercises.expected import paired, public_expected, reference
from servelab.exercises.hidden import hidden_rng
from servelab.exercises.result import Case, CaseFailure, CheckResult, run_cases

__all__ = ["check_speculative", "expected_from_reference", "output_distribution_of"]

Accept = Callable[[np.ndarray, np.ndarray, int], float]
Residual = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _random_pair(seed: int, vocab: int) -> tuple[list[float], list[float]]:
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.full(vocab, 0.5))
    return p.tolist(), q.tolist()


# (rule, pairs of (p, q), points)
SPEC_CASES = (
    ("a draft token is kept with probability min(1, p(x)/q(x))",
     [([0.5, 0.3, 0.2], [0.25, 0.5, 0.25])], 1),
    ("the output is distributed exactly as p (enumerated over every draft token and branch)",
     [([0.6, 0.3, 0.1], [0.2, 0.3, 0.5]), ([0.1, 0.1, 0.8], [0.7, 0.2, 0.1])], 2),
    ("a rejected draft is replaced from norm(max(0, p - q)), not from p",
     [([0.5, 0.5, 0.0], [0.0, 0.5, 0.5])], 2),
    ("a token the draft never proposes (q = 0) still comes out with probability p",
     [([0.2, 0.5, 0.3], [0.0, 0.6, 0.4])], 1),
    ("when p equals q nothing is rejected and the output is p",
     [([0.4, 0.4, 0.2], [0.4, 0.4, 0.2])], 1),
    ("greedy (one-hot p and q) keeps the draft exactly when it is the target's argmax",
     [([0.0, 1.0, 0.0], [0.0, 1.0, 0.0]), ([1.0, 0.0, 0.0], [0.0, 1.0, 0.0])], 1),
    ("exact on random pairs over a 6-token vocabulary (seeded)",
     [_random_pair(seed, 6) for seed in range(3)], 2),
)


def hidden_cases(seed: int) -> tuple:
    """The public rules with each pair's vocabulary permuted (the same permutation for p and q) and
    the random pairs drawn from seeds of ``seed``."""
    rng = hidden_rng(seed, "speculative")
    cases = []
    for index, (rule, pairs, points) in enumerate(SPEC_CASES):
        if index == len(SPEC_CASES) - 1:
            pairs = [_random_pair(rng.randrange(2**31), 6) for _ in pairs]
        permuted = []
        for p, q in pairs:
            order = list(range(len(p)))
            rng.shuffle(order)
            permuted.append(([p[i] for i in order], [q[i] for i in order]))
        cases.append((rule, permuted, points))
    return tuple(cases)


def expected_from_reference(cases: tuple) -> list[list[dict[str, list[float]]]]:
    """For every pair of every case, the reference's ``accept`` probability of each token (0 where
    ``q = 0``: never drafted) and its ``residual`` distribution."""
    ref = reference()
    values = []
    for _, pairs, _ in cases:
        expected = []
        for p_list, q_list in pairs:
            p, q = np.array(p_list), np.array(q_list)
            accept = [ref.reference_accept(p, q, x) if q[x] > 0 else 0.0 for x in range(p.size)]
            expected.append({"accept": accept, "residual": ref.reference_residual(p, q).tolist()})
        values.append(expected)
    return values


def _table(seed: int | None) -> list[tuple]:
    """The cases of ``seed`` (public when None), each paired with its pairs' expected values."""
    cases = SPEC_CASES if seed is None else hidden_cases(seed)
    values = public_expected("speculative") if seed is None else expected_from_reference(cases)
    return paired("speculative", cases, values)


def _accept_vector(
    accept: Accept, p: np.ndarray, q: np.ndarray, expected: list[float] | None = None
) -> np.ndarray:
    """The student's acceptance probability for every token the draft can propose (0 where q = 0); a
    value that is not a probability fails, naming the right one when ``expected`` is given."""
    out = np.zeros_like(p)
    for x in np.flatnonzero(q > 0):
        value = float(accept(p.copy(), q.copy(), int(x)))
        if not 0.0 <= value <= 1.0:
            right = f"; expected {expected[x]:.4f}" if expected is not None else ""
            raise CaseFailure(
                f"accept_probability(p={_r(p)}, q={_r(q)}, token={x}) returned {value:.4f}, "
                f"which is not a probability{right}"
            )
        out[x] = value
    return out


def output_distribution_of(accept: Accept, residual: Residual, p: np.ndarray, q: np.ndarray,
                           expected_accept: list[float] | None = None) -> np.ndarray:
    """The exact distribution of one emitted token under a given accept/correct pair, by enumeration
    (``expected_accept``, when given, is named if ``accept`` returns something that is not a
    probability)."""
    a = _accept_vector(accept, p, q, expected_accept)
    kept = q * a
    reject = 1.0 - kept.sum()
    if reject <= 1e-12:
        return kept
    return kept + reject * np.asarray(residual(p.copy(), q.copy()), dtype=float)


def _r(v: np.ndarray | list[float]) -> list[float]:
    return [round(float(x), 4) for x in v]


def _exact(
    accept: Accept, residual: Residual, p_list: list[float], q_list: list[float], expected: dict
) -> None:
    p, q = np.array(p_list), np.array(q_list)
    drafted = np.flatnonzero(q > 0)
    a_ref = _r(np.array(expected["accept"])[drafted])
    a_got = _r(_accept_vector(accept, p, q, expected["accept"])[drafted])
    steps = (
        f"\nsteps: drafted tokens {drafted.tolist()}, accept probabilities {a_got} (expected "
        f"{a_ref})"
    )
    out = output_distribution_of(accept, residual, p, q, expected["accept"])
    if out.shape != p.shape or not np.allclose(out, p, atol=1e-9):
        reject = 1.0 - float((q * _accept_vector(accept, p, q, expected["accept"])).sum())
        if reject > 1e-12:
            r_got = _r(np.asarray(residual(p.copy(), q.copy()), dtype=float))
            steps += (
                f", P(reject) = {reject:.4f}, residual {r_got} (expected "
                f"{_r(expected['residual'])})"
            )
        raise CaseFailure(f"p={_r(p)}, q={_r(q)}: the emitted token is distributed as {_r(out)}, "
                          f"expected p = {_r(p)}{steps}")


def _accept_only(accept: Accept, p_list: list[float], q_list: list[float], expected: dict) -> None:
    """The first rule on its own: every drafted token's acceptance probability, before any
    enumeration."""
    p, q = np.array(p_list), np.array(q_list)
    got, right = _r(_accept_vector(accept, p, q, expected["accept"])), _r(expected["accept"])
    if got != right:
        raise CaseFailure(
            f"p={_r(p)}, q={_r(q)}: accept probabilities for tokens 0..{p.size - 1} {got}, "
            f"expected {right}"
        )


def _case(
    accept: Accept, residual: Residual, pairs: list, expected: list[dict], accept_only: bool
) -> None:
    for (p, q), right in zip(pairs, expected, strict=True):
        _accept_only(accept, p, q, right) if accept_only else _exact(accept, residual, p, q, right)


def check_speculative(accept_probability: Accept, residual: Residual, verbose: bool = True,
                      seed: int | None = None) -> CheckResult:
    """Run the accept/correct cases (public, or the hidden ones of ``seed``): the accept rule alone,
    then exactness by enumeration."""
    cases = [Case(rule, lambda pairs=pairs, e=expected, first=i == 0:
                  _case(accept_probability, residual, pairs, e, first), points)
             for i, ((rule, pairs, points), expected) in enumerate(_table(seed))]
    return run_cases("speculative accept/correct", cases, verbose)


def worked_example() -> str:
    """The first public case: the accept probabilities, the residual and the output a correct pair
    gives."""
    (_, ((p_list, q_list), *_), _), (expected, *_) = _table(None)[0]
    p, q = np.array(p_list), np.array(q_list)
    out = output_distribution_of(lambda p, q, token: expected["accept"][token],
                                 lambda p, q: np.array(expected["residual"]), p, q)
    return (f"p = {_r(p)}, q = {_r(q)}\n"
            f"accept_probability for tokens 0, 1, 2 -> {_r(expected['accept'])}\n"
            f"residual(p, q) -> {_r(expected['residual'])}\n"
            f"output distribution (enumerated) -> {_r(out)}")
