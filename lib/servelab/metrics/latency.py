"""Serving metrics: TTFT, ITL, TPOT, throughput, SLO attainment, goodput, percentiles and bands.

Load tests count completions, attainment and goodput over one population (:func:`window_report`)
and summarise repeated runs as a mean with a min-max band (:func:`band`).

System boundary: every timestamp passed in must be taken at the same place -- for example at the
server's streaming layer, or at the client -- because TTFT measured at the client also contains
network transit and the gateway. Times are in seconds unless the caller uses another unit
consistently (the tick simulators in ``servelab.scheduling.batching`` pass ticks). A request's *emit
times* are the instants its output tokens left that boundary, in order.

The roofline (ridge point, prefill and decode FLOPs and bytes) is :mod:`servelab.metrics.roofline`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from servelab._validate import require_real

__all__ = [
    "ttft",
    "itl",
    "tpot",
    "e2e_identity_holds",
    "RequestTiming",
    "Throughputs",
    "throughputs",
    "meets_slo",
    "slo_attainment",
    "goodput",
    "WindowReport",
    "window_report",
    "Percentile",
    "percentile",
    "Band",
    "band",
]


def _require_emit_times(emit_times: object, minimum_count: int = 1) -> list:
    if not isinstance(emit_times, (list, tuple, np.ndarray)):
        raise TypeError("emit_times must be a list or tuple of emit instants")
    times = list(emit_times)
    if len(times) < minimum_count:
        raise ValueError(
            f"emit_times must hold at least {minimum_count} instants, got {len(times)}"
        )
    for t in times:
        require_real("emit_times[i]", t, -math.inf)
    if any(b < a for a, b in zip(times, times[1:])):
        raise ValueError("emit_times must be non-decreasing")
    return times


def _ttft(arrival: float, times: Sequence[float]) -> float:
    return times[0] - arrival


def _itl(times: Sequence[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:])]


def _tpot(times: Sequence[float]) -> float:
    return (times[-1] - times[0]) / (len(times) - 1)


def ttft(arrival: float, emit_times: Sequence[float]) -> float:
    """Time to first token: first emit instant minus arrival (seconds)."""
    require_real("arrival", arrival, -math.inf)
    times = _require_emit_times(emit_times)
    if times[0] < arrival:
        raise ValueError("emit_times[0] must not precede arrival")
    return _ttft(arrival, times)


def itl(emit_times: Sequence[float]) -> list[float]:
    """Inter-token latencies ITL_j = t_j - t_(j-1), one per token after the first (seconds)."""
    return _itl(_require_emit_times(emit_times))


def tpot(emit_times: Sequence[float]) -> float:
    """Time per output token after the first: (t_last - t_first) / (N_out - 1), seconds/token.

    Defined only for N_out >= 2; it is not total latency divided by the token count.
    """
    return _tpot(_require_emit_times(emit_times, minimum_count=2))


def e2e_identity_holds(arrival: float, emit_times: Sequence[float], tol: float = 1e-9) -> bool:
    """Check t_last - t_arrival == TTFT + sum(ITL) within ``tol`` (an identity at one boundary)."""
    require_real("tol", tol, 0.0)
    lhs = _require_emit_times(emit_times)[-1] - arrival
    return abs(lhs - (ttft(arrival, emit_times) + sum(itl(emit_times)))) <= tol


@dataclass(frozen=True)
class RequestTiming:
    """One request's timestamps (seconds, one system boundary) and token counts.

    ``first_scheduled`` is when the scheduler first ran it, ``finish`` when it left the system
    (at or after its last emit). ``prompt_tokens`` feeds total-token throughput.
    """

    arrival: float
    first_scheduled: float
    emit_times: tuple[float, ...]
    finish: float
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "emit_times", tuple(_require_emit_times(self.emit_times)))
        for name in ("arrival", "first_scheduled", "finish"):
            require_real(name, getattr(self, name), -math.inf)
        if not self.arrival <= self.first_scheduled <= self.emit_times[0]:
            raise ValueError("first_scheduled must lie between arrival and the first emit")
        if self.finish < self.emit_times[-1]:
            raise ValueError("finish must not precede the last emit")
        if isinstance(self.prompt_tokens, bool) or not isinstance(self.prompt_tokens, int):
            raise TypeError("prompt_tokens must be an int >= 0")
        if self.prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be an int >= 0, got {self.prompt_tokens}")

    @property
    def output_tokens(self) -> int:
        return len(self.emit_times)

    @property
    def queue_delay(self) -> float:
        return self.first_scheduled - self.arrival

    # emit_times was checked once in __post_init__; the properties do not check it again

    @property
    def ttft(self) -> float:
        return _ttft(self.arrival, self.emit_times)

    @property
    def itl(self) -> list:
        return _itl(self.emit_times)

    @property
    def tpot(self) -> float | None:
        """TPOT in seconds/token, or None when the request emitted a single token."""
        return _tpot(self.emit_times) if self.output_tokens >= 2 else None

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival


def _require_records(records: object) -> list[RequestTiming]:
    if not isinstance(records, (list, tuple)) or not all(
        isinstance(r, RequestTiming) for r in records
    ):
        raise TypeError("records must be a list of RequestTiming")
    if not records:
        raise ValueError("records must hold at least one RequestTiming")
    return list(records)


def _require_window(window: object) -> tuple[float, float]:
    if not isinstance(window, tuple) or len(window) != 2:
        raise TypeError("window must be a (start, end) tuple in seconds")
    start = require_real("window[0]", window[0], -math.inf)
    end = require_real("window[1]", window[1], -math.inf)
    if end <= start:
        raise ValueError(f"window must satisfy start < end, got {window}")
    return start, end


def _completed_in(records: list[RequestTiming], window: tuple[float, float]) -> list[RequestTiming]:
    start, end = window
    return [r for r in records if start <= r.finish <= end]


@dataclass(frozen=True)
class Throughputs:
    """The three throughput dimensions, all per second: requests, output tokens, total tokens."""

    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float


def throughputs(records: Sequence[RequestTiming], window: tuple[float, float]) -> Throughputs:
    """Rates over ``window`` = (start, end) seconds, counting requests that finished inside it.

    Total tokens add each finished request's prompt tokens to its output tokens.
    """
    recs = _require_records(records)
    start, end = _require_window(window)
    done = _completed_in(recs, (start, end))
    span = end - start
    out = sum(r.output_tokens for r in done)
    return Throughputs(
        len(done) / span, out / span, (out + sum(r.prompt_tokens for r in done)) / span
    )


def meets_slo(
    record: RequestTiming, ttft_slo: float, tpot_slo: float, deadline: float | None = None
) -> bool:
    """True when TTFT <= ttft_slo, TPOT <= tpot_slo and (if given) e2e <= deadline, in seconds.

    A single-token request has no TPOT and is judged on TTFT and deadline only.
    """
    if not isinstance(record, RequestTiming):
        raise TypeError("record must be a RequestTiming")
    require_real("ttft_slo", ttft_slo, 0.0)
    require_real("tpot_slo", tpot_slo, 0.0)
    if deadline is not None:
        require_real("deadline", deadline, 0.0)
    ok = record.ttft <= ttft_slo and (record.tpot is None or record.tpot <= tpot_slo)
    return ok and (deadline is None or record.e2e <= deadline)


def slo_attainment(
    records: Sequence[RequestTiming],
    ttft_slo: float,
    tpot_slo: float,
    deadline: float | None = None,
) -> float:
    """Fraction (0..1, dimensionless) of requests meeting every SLO: N_slo / N_total.

    The population is every record passed in; :func:`goodput` counts only those finished inside its
    window. For a load test use :func:`window_report`, which takes both over one population.
    """
    recs = _require_records(records)
    return sum(meets_slo(r, ttft_slo, tpot_slo, deadline) for r in recs) / len(recs)


def goodput(
    records: Sequence[RequestTiming],
    ttft_slo: float,
    tpot_slo: float,
    window: tuple[float, float],
    deadline: float | None = None,
    unit: str = "requests",
) -> float:
    """Rate of SLO-meeting work over ``window``: requests/s, or output tokens/s with unit="tokens".

    A rate, never a fraction: N_slo / window length, counting requests finished inside the window.
    """
    recs = _require_records(records)
    start, end = _require_window(window)
    if unit not in ("requests", "tokens"):
        raise ValueError(f"unit must be 'requests' or 'tokens', got {unit!r}")
    good = [
        r for r in _completed_in(recs, (start, end)) if meets_slo(r, ttft_slo, tpot_slo, deadline)
    ]
    amount = len(good) if unit == "requests" else sum(r.output_tokens for r in good)
    return amount / (end - start)


@dataclass(frozen=True)
class WindowReport:
    """Completions, SLO attainment and goodput over ONE population: the requests finished in a
    window.

    ``completed`` requests finished inside the window (``span_s`` seconds long), ``met`` of them met
    every SLO, and they emitted ``output_tokens`` tokens. ``open_at_close`` requests arrived before
    the window's end but finished after it: they belong to no count here, and under overload they
    are the latest of all, so ``attainment`` is then an upper bound for the offered work. Because
    the three rates share one population, ``goodput == attainment * completion_rate`` exactly.
    """

    span_s: float
    completed: int
    met: int
    output_tokens: int
    open_at_close: int

    @property
    def completion_rate(self) -> float:
        """Requests finished per second inside the window."""
        return self.completed / self.span_s

    @property
    def attainment(self) -> float:
        """Fraction of the completed requests that met every SLO (0 when none completed)."""
        return self.met / self.completed if self.completed else 0.0

    @property
    def goodput(self) -> float:
        """SLO-meeting requests finished per second inside the window (a rate)."""
        return self.met / self.span_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.span_s


def window_report(
    records: Sequence[RequestTiming],
    ttft_slo: float,
    tpot_slo: float,
    window: tuple[float, float],
    deadline: float | None = None,
) -> WindowReport:
    """Count the requests finished inside ``window`` = (start, end) seconds and those meeting every
    SLO (TTFT <= ``ttft_slo``, TPOT <= ``tpot_slo``, e2e <= ``deadline`` if given, in seconds)."""
    recs = _require_records(records)
    start, end = _require_window(window)
    done = _completed_in(recs, (start, end))
    met = sum(meets_slo(r, ttft_slo, tpot_slo, deadline) for r in done)
    still_open = sum(r.arrival <= end < r.finish for r in recs)
    return WindowReport(end - start, len(done), met, sum(r.output_tokens for r in done), still_open)


@dataclass(frozen=True)
class Percentile:
    """A quantile estimate with its sample size.

    ``enough_samples`` is False when n < 100 / (100 - q): fewer samples than one expected above the
    quantile (p99 needs n >= 100), so the value is a guess at the tail, not a measurement of it.
    """

    q: float
    value: float
    n: int
    enough_samples: bool


def percentile(values: Sequence[float], q: float) -> Percentile:
    """The q-th percentile (0 <= q < 100, linear interpolation) with n, warning when n is too
    small."""
    if not isinstance(values, (list, tuple, np.ndarray)):
        raise TypeError("values must be a list, tuple or array of numbers")
    data = np.asarray(values, dtype=float)
    if data.ndim != 1 or data.size == 0 or not np.all(np.isfinite(data)):
        raise ValueError("values must be a non-empty 1-D sequence of finite numbers")
    require_real("q", q, 0.0)
    if q >= 100:
        raise ValueError(f"q must satisfy 0 <= q < 100, got {q}")
    enough = data.size >= math.ceil(100 / (100 - q) - 1e-9)
    if not enough:
        warnings.warn(
            f"p{q:g} from only {data.size} samples is not a tail measurement", stacklevel=2
        )
    return Percentile(q, float(np.percentile(data, q)), int(data.size), bool(enough))


@dataclass(frozen=True)
class Band:
    """The spread of one quantity over ``n`` repeated runs (for example one per random seed).

    ``mean`` is the average, ``low`` and ``high`` the smallest and largest run: the band a figure
    shades. Two bands that overlap do not support a claim that one value is above the other.
    """

    mean: float
    low: float
    high: float
    n: int

    def relation_to(self, other: "Band") -> str:
        """``"above"`` or ``"below"`` when the two bands are disjoint, else ``"overlaps"``."""
        if not isinstance(other, Band):
            raise TypeError(f"other must be a Band, got {type(other).__name__}")
        if self.low > other.high:
            return "above"
        if self.high < other.low:
            return "below"
        return "overlaps"


def band(values: Sequence[float]) -> Band:
    """Mean, minimum and maximum of ``values`` (one per run, at least one, all finite)."""
    if not isinstance(values, (list, tuple, np.ndarray)):
        raise TypeError("values must be a list, tuple or array of numbers")
    data = np.asarray(values, dtype=float)
    if data.ndim != 1 or data.size == 0 or not np.all(np.isfinite(data)):
        raise ValueError("values must be a non-empty 1-D sequence of finite numbers")
    return Band(float(data.mean()), float(data.min()), float(data.max()), int(data.size))
