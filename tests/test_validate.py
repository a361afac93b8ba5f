"""Tests for the shared argument checks in servelab._validate."""

import math
from fractions import Fraction

import pytest

from servelab._validate import require_int, require_name, require_real


def test_require_int_accepts_and_returns_value():
    assert require_int("n", 3, 1) == 3
    assert require_int("n", 0) == 0
    assert require_int("n", 5, 0, 5) == 5


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None])
def test_require_int_rejects_non_ints_with_type_error(value):
    with pytest.raises(TypeError, match=r"n must be an int >= 1, got "):
        require_int("n", value, 1)


def test_require_int_range_messages():
    with pytest.raises(ValueError, match=r"^capacity must be an int >= 1, got 0$"):
        require_int("capacity", 0, 1)
    with pytest.raises(ValueError, match=r"^k must be an int in \[1, 4\], got 5$"):
        require_int("k", 5, 1, 4)
    with pytest.raises(ValueError, match=r"^k must be an int <= 4, got 5$"):
        require_int("k", 5, maximum=4)


def test_require_real_accepts_reals_unchanged():
    assert require_real("x", 2, 0) == 2 and isinstance(require_real("x", 2, 0), int)
    assert require_real("x", 0.0, 0) == 0.0
    assert require_real("x", Fraction(1, 2), 0, 1) == Fraction(1, 2)
    assert require_real("x", -5.0, -math.inf) == -5.0


@pytest.mark.parametrize("value", [True, "1.0", None, 1j])
def test_require_real_rejects_non_reals_with_type_error(value):
    with pytest.raises(TypeError, match=r"^x must be a real number, got "):
        require_real("x", value, 0)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_require_real_rejects_non_finite(value):
    with pytest.raises(ValueError, match=r"^x must be finite"):
        require_real("x", value)


def test_require_real_range_messages():
    with pytest.raises(ValueError, match=r"^x must be finite and >= 0, got -1$"):
        require_real("x", -1, 0)
    with pytest.raises(ValueError, match=r"^x must be finite and > 0, got 0$"):
        require_real("x", 0, 0, strict_min=True)
    with pytest.raises(ValueError, match=r"^x must be finite and in \[0, 1\), got 1$"):
        require_real("x", 1, 0, 1, strict_max=True)
    with pytest.raises(ValueError, match=r"^x must be finite and <= 1, got 2$"):
        require_real("x", 2, maximum=1)


def test_require_name():
    assert require_name("name", "a") == "a"
    with pytest.raises(TypeError, match=r"^name must be a non-empty str, got int$"):
        require_name("name", 3)
    with pytest.raises(ValueError, match=r"^name must be a non-empty str$"):
        require_name("name", "")
