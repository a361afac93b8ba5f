"""Shared argument checks for the servelab library.

Each checker returns the value it was given (unchanged, so an ``int`` passed to :func:`require_real`
stays an ``int``), raises :class:`TypeError` when the value has the wrong type and
:class:`ValueError` when it has the right type but lies outside the allowed range. Messages name the
parameter and the allowed range, e.g. ``"capacity must be an int >= 1, got 0"``.

``bool`` is rejected wherever a number is expected: ``True`` is an ``int`` to Python but never a
meaningful count or duration here.

Private to the library (the leading underscore): modules import it as
``from servelab._validate import require_int``; it is not part of the public API.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Hashable, Iterable
from numbers import Real

__all__ = [
    "require_int",
    "require_index",
    "require_indices",
    "require_real",
    "require_interval",
    "require_name",
    "require_id",
    "require_type",
]


def _is_bool(value: object) -> bool:
    """``bool`` or numpy's bool scalar (``numpy.bool_``), without importing numpy."""
    return isinstance(value, bool) or type(value).__name__ in ("bool", "bool_")


def _int_range(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""


def require_int(
    name: str, value: object, minimum: int | None = None, maximum: int | None = None
) -> int:
    """Check that ``value`` is an ``int`` (not a ``bool``) with ``minimum <= value <= maximum``.

    Either bound may be ``None`` (unbounded). Returns ``value``.

    Raises:
        TypeError: ``value`` is not an ``int``, or is a ``bool``:
            ``"{name} must be an int >= {minimum}, got {type}"``.
        ValueError: ``value`` is out of range: ``"{name} must be an int >= {minimum}, got {value}"``
            (``"an int in [{minimum}, {maximum}]"`` when both bounds are given).
    """
    wanted = f"{name} must be an int{_int_range(minimum, maximum)}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{wanted}, got {type(value).__name__}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{wanted}, got {value}")
    return value


def require_index(
    name: str, value: object, minimum: int | None = None, maximum: int | None = None
) -> int:
    """Like :func:`require_int`, but also accepts integer-like values (``numpy.int64``: anything
    with ``__index__``) and returns them as a plain ``int``; ``bool`` is still rejected."""
    if (
        type(value) is int
        and (minimum is None or value >= minimum)
        and (maximum is None or value <= maximum)
    ):
        return value  # the common case, checked without building a message (allocator hot path)
    wanted = f"{name} must be an int{_int_range(minimum, maximum)}"
    if _is_bool(value):
        raise TypeError(f"{wanted}, got bool")
    try:
        as_int = operator.index(value)
    except TypeError:
        raise TypeError(f"{wanted}, got {type(value).__name__}") from None
    return require_int(name, as_int, minimum, maximum)


def require_indices(
    name: str, values: object, minimum: int | None = 0, *, allow_empty: bool = True
) -> tuple[int, ...]:
    """A sequence of integer-like values (token ids, lengths) as a tuple of ``int``, each checked by
    :func:`require_index` under the name ``{name}[i]``. Raises TypeError for a str, bytes or
    non-iterable, ValueError for an empty sequence unless ``allow_empty``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    checked = tuple(values)
    # else: name the bad one
    if not all(type(v) is int and (minimum is None or v >= minimum) for v in checked):
        checked = tuple(require_index(f"{name}[{i}]", v, minimum) for i, v in enumerate(checked))
    if not checked and not allow_empty:
        raise ValueError(f"{name} must hold at least one int, got an empty sequence")
    return checked


def _real_range(
    minimum: float | None, maximum: float | None, strict_min: bool, strict_max: bool
) -> str:
    if minimum is not None and maximum is not None:
        left = "(" if strict_min else "["
        right = ")" if strict_max else "]"
        return f" and in {left}{minimum}, {maximum}{right}"
    if minimum is not None:
        return f" and {'>' if strict_min else '>='} {minimum}"
    if maximum is not None:
        return f" and {'<' if strict_max else '<='} {maximum}"
    return ""


def require_real(
    name: str,
    value: object,
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    strict_min: bool = False,
    strict_max: bool = False,
) -> float:
    """Check that ``value`` is a finite real number (not a ``bool``) inside the given range.

    ``minimum``/``maximum`` may be ``None`` (unbounded); ``strict_min``/``strict_max`` exclude the
    bound itself (``value > minimum`` instead of ``>=``). NaN and +/-inf are always rejected.
    Returns ``value`` unchanged (an ``int`` stays an ``int``).

    Raises:
        TypeError: ``value`` is not a :class:`numbers.Real`, or is a ``bool``:
            ``"{name} must be a real number, got {type}"``.
        ValueError: ``value`` is not finite or out of range:
            ``"{name} must be finite and >= {minimum}, got {value}"`` (``>`` when ``strict_min``;
            ``"finite and in [{minimum}, {maximum}]"`` when both bounds are given).
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    too_low = minimum is not None and (value <= minimum if strict_min else value < minimum)
    too_high = maximum is not None and (value >= maximum if strict_max else value > maximum)
    if not math.isfinite(value) or too_low or too_high:
        raise ValueError(
            f"{name} must be "
            f"finite{_real_range(minimum, maximum, strict_min, strict_max)}, got {value}"
        )
    return value


def require_interval(name: str, value: object, low: float, high: float, *, low_open: bool = False,
                     high_open: bool = False) -> float:
    """``value`` as a ``float`` after checking it is a real number (numpy scalars included, ``bool``
    not) inside the interval from ``low`` to ``high`` (``low_open`` / ``high_open`` exclude an end;
    an infinite end is allowed). NaN is rejected.

    Raises:
        TypeError: ``"{name} must be a real number in {interval}, got {type}"``.
        ValueError: ``"{name} must be in {interval}, got {value!r}"``, e.g. ``"p must be in (0.0,
            1.0], got 0"``.
    """
    interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if _is_bool(value) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number in {interval}, got {type(value).__name__}")
    number = float(value)
    too_low = number <= low if low_open else number < low
    too_high = number >= high if high_open else number > high
    if math.isnan(number) or too_low or too_high:
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return number


def require_name(name: str, value: object) -> str:
    """Check that ``value`` is a non-empty ``str``; ``name`` is the parameter's name for the
    message.

    Returns ``value``.

    Raises:
        TypeError: ``value`` is not a ``str``: ``"{name} must be a non-empty str, got {type}"``.
        ValueError: ``value`` is ``""``: ``"{name} must be a non-empty str"``.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a non-empty str, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must be a non-empty str")
    return value


def require_id(name: str, value: object) -> Hashable:
    """Check that ``value`` can key a dict and is not ``None`` (a request or sequence id). Returns
    it."""
    if value is None or not isinstance(value, Hashable):
        raise TypeError(f"{name} must be a hashable, non-None id, got {value!r}")
    return value


def require_type(name: str, value: object, kind: type | tuple[type, ...]) -> object:
    """Check ``isinstance(value, kind)`` (``bool`` is not accepted where ``kind`` is ``int``).
    Returns it.

    Raises TypeError: ``"{name} must be a {kind}, got {type}"``.
    """
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (
        isinstance(value, bool) and bool not in kinds and int in kinds
    ):
        names = " or ".join(k.__name__ for k in kinds)
        raise TypeError(f"{name} must be a {names}, got {type(value).__name__}")
    return value
