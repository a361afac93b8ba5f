"""Log axes that read at a glance: labels on major decades only, minor ticks unlabeled.

Plotly labels a log axis's minor ticks with their leading digit alone ("2 5 2 100"), which reads as
a sequence that is not monotone. :func:`label_log_axes` rewrites every log axis of a figure spec
(plotly's JSON, as :func:`servelab.viz.core.figure_html` emits it) that has no explicit ticks:
labels at 1, 10, 100, ... when the data span at least two decades, else at 1-2-5 steps (still in
full: "20", "50", "100"), and unlabeled minor ticks in between. The data range is read from every
trace (and every slider frame) drawn on the axis.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Iterable

import numpy as np

__all__ = ["label_log_axes", "log_ticks", "tick_text"]

AXIS_KEY = re.compile(r"^([xy])axis(\d*)$")
SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k"))


def tick_text(value: float) -> str:
    """A tick label in full: "1", "0.01", "2,000", "10k", "1M", "1e-5"."""
    for scale, suffix in SI:
        if value >= scale:
            shown = value / scale if suffix != "k" else value / 1e3
            return f"{shown:,.10g}{suffix}"
    if value >= 1e-3:
        return f"{value:,.10g}"
    mantissa, exponent = f"{value:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def log_ticks(low: float, high: float) -> list[float]:
    """Tick values for a log axis over data in [low, high] (both > 0): decades when the data span
    two or more of them, else the 1-2-5 steps around the data."""
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high, got {low}, {high}")
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    decades = [10.0**k for k in range(first, last + 1)]
    if sum(low / 1.0001 <= d <= high * 1.0001 for d in decades) >= 2:
        return decades
    steps = [m * 10.0**k for k in range(first, last + 1) for m in (1, 2, 5)]
    return [v for v in steps if low / 2.5 <= v <= high * 2.5]


def _values(array: object) -> np.ndarray:
    """Numbers of a plotly data array: a list, or plotly's typed array {"dtype", "bdata"}."""
    if isinstance(array, dict) and "bdata" in array:
        return (
            np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"])
            .astype(float)
            .ravel()
        )
    flat = (
        np.asarray(array, dtype=object).ravel()
        if isinstance(array, (list, tuple))
        else np.array([])
    )
    numbers = [float(v) for v in flat if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return np.array(numbers, dtype=float)


def _traces(spec: dict) -> Iterable[dict]:
    yield from spec.get("data", [])
    for frame in spec.get("frames", []) or []:
        yield from frame.get("data", [])


def _axis_range(spec: dict, letter: str, suffix: str) -> tuple[float, float] | None:
    ref = f"{letter}{suffix}"
    found = [_values(t[letter]) for t in _traces(spec)
             if letter in t and (t.get(f"{letter}axis") or letter) == ref]
    values = np.concatenate(found) if found else np.array([])
    values = values[np.isfinite(values) & (values > 0)]
    return (float(values.min()), float(values.max())) if values.size else None


def label_log_axes(spec: dict) -> dict:
    """``spec`` (plotly JSON: data, layout, frames) with every log axis labelled by
    :func:`log_ticks`; an axis that sets its own ticks (``tickvals`` or ``dtick``) or has no
    positive data is left alone."""
    layout = spec.get("layout", {})
    for key, axis in layout.items():
        match = AXIS_KEY.match(key)
        if not match or not isinstance(axis, dict) or axis.get("type") != "log":
            continue
        if "tickvals" in axis or "dtick" in axis:
            continue
        span = _axis_range(spec, match.group(1), match.group(2))
        if span is None:
            continue
        values = log_ticks(*span)
        axis.update(tickmode="array", tickvals=values, ticktext=[tick_text(v) for v in values],
                    minor={"ticks": "outside", "ticklen": 3, "dtick": "D1", "showgrid": False})
    return spec
