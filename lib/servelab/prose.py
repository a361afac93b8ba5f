"""Numbers and flags from data, written as words a reader reads as prose.

A page that pastes a computed value into a sentence must not print ``True``, ``1 token(s)`` or
``m=1``. These helpers are the one way the notebooks, figures and tables turn data into words:

* :func:`yes_no` for a flag;
* :func:`count` for a count with its noun in agreement ("1 block", "3 blocks");
* :func:`listed` for a list in a sentence ("a, b and c"; "none" when empty);
* :func:`rounded` for a float with only the significant digits a claim needs.

:func:`servelab.viz.core.table` writes a boolean cell with :func:`yes_no`.
``browser_tests/test_book_text.py`` fails on the built book when prose shows a boolean or "(s)", and
``tests/test_notebook_text.py`` on the committed outputs of the chapter notebooks.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

__all__ = ["count", "listed", "rounded", "yes_no"]


def yes_no(flag: bool) -> str:
    """``"yes"`` or ``"no"``; numpy booleans too."""
    if not isinstance(flag, (bool, np.bool_)):
        raise TypeError(f"flag must be a bool, got {type(flag).__name__}")
    return "yes" if flag else "no"


def count(n: int, singular: str, plural: str | None = None) -> str:
    """``n`` and its noun in agreement: ``count(1, "block")`` is "1 block", ``count(2, "block")``
    "2 blocks"; give ``plural`` for an irregular noun. Thousands get a comma."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    noun = singular if int(n) == 1 else (plural or f"{singular}s")
    return f"{int(n):,} {noun}"


def listed(items: Sequence[object], empty: str = "none", conjunction: str = "and") -> str:
    """Items joined as in a sentence: "a", "a and b", "a, b and c"; ``empty`` when there are
    none."""
    words = [str(item) for item in items]
    if not words:
        return empty
    if len(words) == 1:
        return words[0]
    return f"{', '.join(words[:-1])} {conjunction} {words[-1]}"


def rounded(value: float, digits: int = 3) -> float:
    """``value`` to ``digits`` significant digits (2.0999999999999996 -> 2.1); 0 stays 0."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"value must be a real number, got {type(value).__name__}")
    x = float(value)
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))
