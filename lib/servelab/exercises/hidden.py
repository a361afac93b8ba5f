"""Seeded helpers for the hidden cases the grader generates from an instructor's secret seed.

Each checker takes ``seed=None`` (its public cases, the ones the notebook runs) or an int (hidden
cases: the same rules, the same titles and points, different inputs). The inputs are derived from
``seed`` and the checker's name only, so one seed gives every student the same hidden cases, and
the expected values are computed in the grader's process, by the instructor-only reference solutions
where a checker has one (:mod:`servelab.exercises.expected`).
"""

from __future__ import annotations

import random
import string

__all__ = ["hidden_rng", "renamer"]


def hidden_rng(seed: int, checker: str) -> random.Random:
    """The generator of ``checker``'s hidden cases for ``seed`` (independent across checkers)."""
    return random.Random(f"servelab-hidden-cases:{checker}:{seed}")


def renamer(rng: random.Random, names: list[str]) -> dict[str, str]:
    """A map from each of ``names`` to a fresh distinct two-letter-and-digit name (``"Kq7"``)."""
    fresh: dict[str, str] = {}
    used: set[str] = set()
    for name in names:
        while name not in fresh:
            candidate = (
                rng.choice(string.ascii_uppercase)
                + rng.choice(string.ascii_lowercase)
                + str(rng.randrange(10))
            )
            if candidate not in used:
                fresh[name], used = candidate, used | {candidate}
    return fresh
