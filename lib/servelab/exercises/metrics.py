"""Checker for the goodput exercise.

Student signature::

    def goodput(records: list[RequestTiming], ttft_slo: float, tpot_slo: float,
                window: tuple[float, float]) -> float: ...

Goodput is the number of requests that finished inside ``window`` and met both SLOs (TTFT <=
ttft_slo, and TPOT <= tpot_slo when the request emitted at least two tokens), divided by the
window's length: requests per second, a rate and never a fraction. The reference is
``servelab.metrics.latency.goodput``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from servelab.exercises.hidden import hidden_rng
from servelab.exercises.result import Case, CaseFailure, CheckResult, run_cases
from servelab.metrics.latency import RequestTiming, goodput, slo_attainment

__all__ = ["check_goodput"]

Goodput = Callable[[list[RequestTiming], float, float, tuple[float, float]], float]


def _req(arrival: float, emits: list[float]) -> RequestTiming:
    return RequestTiming(
        arrival=arrival, first_scheduled=arrival, emit_times=tuple(emits), finish=emits[-1]
    )


FAST = _req(0.0, [0.2, 0.3, 0.4])          # TTFT 0.2 s, TPOT 0.1 s
SLOW_START = _req(1.0, [2.5, 2.6, 2.7])    # TTFT 1.5 s
SLOW_TOKENS = _req(2.0, [2.1, 2.6, 3.1])   # TPOT 0.5 s
ONE_TOKEN = _req(3.0, [3.3])               # no TPOT: judged on TTFT only
LATE = _req(9.0, [9.2, 9.3, 12.0])         # finishes after the window
EDGE = _req(4.0, [4.5, 4.75, 5.0])         # TTFT and TPOT exactly at the SLO

# (rule, records, ttft_slo, tpot_slo, window, points). Each case isolates one rule: only the case
# titled for the TPOT rule has a request that meets its TTFT but misses its TPOT.
GOODPUT_CASES = (
    (
        "goodput is a rate over the window (requests/s), not a fraction",
        [FAST, SLOW_START, ONE_TOKEN],
        1.0,
        0.2,
        (0.0, 10.0),
        2,
    ),
    (
        "a request that misses the TTFT SLO does not count",
        [FAST, SLOW_START],
        1.0,
        0.2,
        (0.0, 5.0),
        1,
    ),
    (
        "a request that meets TTFT but misses the TPOT SLO does not count",
        [FAST, SLOW_TOKENS],
        1.0,
        0.2,
        (0.0, 5.0),
        2,
    ),
    ("a request finishing after the window is not counted", [FAST, LATE], 1.0, 0.2, (0.0, 10.0), 1),
    ("a single-token request has no TPOT to miss", [ONE_TOKEN], 0.5, 0.01, (0.0, 4.0), 1),
    ("meeting the SLO exactly counts", [EDGE, FAST], 0.5, 0.25, (0.0, 5.0), 1),
)


def _scaled(r: RequestTiming, scale: float) -> RequestTiming:
    return RequestTiming(arrival=r.arrival * scale, first_scheduled=r.first_scheduled * scale,
                         emit_times=tuple(t * scale for t in r.emit_times), finish=r.finish * scale)


def hidden_cases(seed: int) -> tuple:
    """The public rules with every time (records, SLOs, window) scaled by a power of two from 1/2 to
    4, and the records shuffled. Powers of two scale these binary fractions exactly, so a request
    that met an SLO exactly still meets it exactly."""
    rng = hidden_rng(seed, "goodput")
    cases = []
    for rule, records, ttft, tpot, (start, end), points in GOODPUT_CASES:
        scale = rng.choice((0.5, 2.0, 4.0))
        scaled = [_scaled(r, scale) for r in records]
        rng.shuffle(scaled)
        cases.append(
            (rule, scaled, ttft * scale, tpot * scale, (start * scale, end * scale), points)
        )
    return tuple(cases)


def _compare(
    fn: Goodput, records: list[RequestTiming], ttft_slo: float, tpot_slo: float, window: tuple
) -> None:
    expected = goodput(records, ttft_slo, tpot_slo, window)
    got = fn(list(records), ttft_slo, tpot_slo, window)
    if (
        isinstance(got, bool)
        or not isinstance(got, (int, float))
        or not math.isclose(got, expected, abs_tol=1e-12)
    ):
        call = (
            f"goodput({len(records)} records, ttft_slo={ttft_slo}, tpot_slo={tpot_slo}, "
            f"window={window})"
        )
        hint = ""
        attainment = slo_attainment(records, ttft_slo, tpot_slo)
        if (
            isinstance(got, (int, float))
            and math.isclose(got, attainment)
            and not math.isclose(attainment, expected)
        ):
            hint = (
                " — that is the SLO attainment fraction; goodput divides by the window length "
                "in seconds"
            )
        inputs = "\n".join(f"  record {i}: {_describe(r)}" for i, r in enumerate(records))
        raise CaseFailure(
            f"{call} returned {got!r}, expected {expected:g} requests/s{hint}\n{inputs}"
        )


def check_goodput(fn: Goodput, verbose: bool = True, seed: int | None = None) -> CheckResult:
    """Run the goodput cases (public, or the hidden ones of ``seed``) against
    ``servelab.metrics.latency.goodput``."""
    table = GOODPUT_CASES if seed is None else hidden_cases(seed)
    cases = [
        Case(rule, lambda r=records, t=ttft, p=tpot, w=window: _compare(fn, r, t, p, w), points)
        for rule, records, ttft, tpot, window, points in table
    ]
    return run_cases("goodput", cases, verbose)


def _describe(r: RequestTiming) -> str:
    ttft, gaps = r.emit_times[0] - r.arrival, len(r.emit_times) - 1
    tpot = f"TPOT {(r.emit_times[-1] - r.emit_times[0]) / gaps:.2f} s" if gaps else "one token"
    return f"arrival {r.arrival:g} s, TTFT {ttft:.2f} s, {tpot}, finish {r.finish:g} s"


def worked_example() -> str:
    """The TPOT case on the reference: the records, the SLOs and the goodput they give."""
    _, records, ttft, tpot, window, _ = GOODPUT_CASES[2]
    lines = [f"  {_describe(r)}" for r in records]
    value = goodput(records, ttft, tpot, window)
    return "\n".join(
        [
            f"records ({len(records)}):",
            *lines,
            f"goodput(records, ttft_slo={ttft}, tpot_slo={tpot}, window={window}) -> "
            f"{value:.2f} requests/s",
        ]
    )
