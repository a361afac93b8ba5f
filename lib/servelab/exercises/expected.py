"""Where the checkers' expected values come from: committed data (public cases) or the reference
(hidden).

The public cases a student runs in a notebook take their expected values from
``public_expected.json`` beside this module, generated from the reference solutions and committed
(``python -m servelab_instructor.public_expected`` rewrites it; ``--check`` reports drift). The
hidden cases of a grading seed are computed by the reference solutions themselves, in the grader's
process: they live in the instructor-only package ``servelab_instructor``, which the wheel students
install does not contain. :func:`reference` names what is missing and how to get it when that
package is absent.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from types import ModuleType

__all__ = [
    "EXPECTED_FILE",
    "MissingReference",
    "REFERENCE_MODULE",
    "REGENERATE",
    "paired",
    "public_expected",
    "reference",
]

EXPECTED_FILE = Path(__file__).with_name("public_expected.json")
REFERENCE_MODULE = "servelab_instructor.reference"
REGENERATE = "python -m servelab_instructor.public_expected"


class MissingReference(RuntimeError):
    """The hidden cases need the instructor-only reference solutions, and they are not
    importable."""


def reference() -> ModuleType:
    """The reference solutions (:mod:`servelab_instructor.reference`); MissingReference when
    absent."""
    try:
        return importlib.import_module(REFERENCE_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name not in ("servelab_instructor", REFERENCE_MODULE):
            raise
        raise MissingReference(
            f"the hidden cases are computed by the reference solutions in "
            f"{REFERENCE_MODULE}, which is not "
            "importable here: the servelab wheel students install does not contain the "
            "instructor package "
            "servelab_instructor. Grade from a checkout of the course repository after "
            "`make setup` (its "
            "editable install puts lib/ on the path), or put the checkout's lib/ on PYTHONPATH "
            "(PYTHONPATH=path/to/servelab/lib python -m servelab_instructor.grader grade ...)"
        ) from None


@cache
def _load() -> dict:
    return json.loads(EXPECTED_FILE.read_text(encoding="utf-8"))


def public_expected(checker: str) -> object:
    """The committed expected values of ``checker``'s public cases; KeyError naming the fix if
    absent."""
    data = _load()
    if checker not in data:
        raise KeyError(
            f"{EXPECTED_FILE.name} has no expected values for {checker!r}; regenerate it with "
            f"{REGENERATE}"
        )
    return data[checker]


def paired(checker: str, cases: Sequence, expected: Sequence) -> list[tuple]:
    """Each case with its expected value; ValueError naming the regeneration command when the counts
    differ."""
    if len(cases) != len(expected):
        raise ValueError(
            f"{EXPECTED_FILE.name} holds {len(expected)} expected values for {checker!r}'s "
            f"{len(cases)} public cases; regenerate it with {REGENERATE}"
        )
    return list(zip(cases, expected))
