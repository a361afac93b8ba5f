"""From raw results to a trustworthy report, and a load sweep from idle to saturation.

:func:`summarize` turns one run into percentiles (with their sample sizes), the three throughputs,
SLO attainment and goodput, all computed by :mod:`servelab.metrics.latency`. It reports the first
``warmup_requests`` requests apart (cold start: weight loading, allocator and kernel warm-up), so a
slow start does not pass for a steady-state tail, and it reports latency both from the planned
arrival (the honest number) and from the actual send (the naive, coordinated-omission-prone one).

:func:`run_sweep` repeats an open-loop run at rising rates; :func:`saturation_index` finds the knee
where the server stops keeping up; :func:`throughput_latency_figure` and :func:`sweep_table` show
the curve, because a single (throughput, latency) point says nothing about where the knee is.

System boundary: the client (see :mod:`servelab.loadgen.client`). Seconds throughout; rates per
second. Failed requests (rejected, timed out, broken) count as missing the SLO and add nothing to
goodput.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from servelab import metrics
from servelab.loadgen.client import Endpoint, RequestResult, RunResult, run_open_loop
from servelab.loadgen.workload import LengthDistribution, build_workload, poisson_arrivals
from servelab.viz import table as viz_table

__all__ = [
    "SLO",
    "PhaseSummary",
    "LoadReport",
    "summarize",
    "report_table",
    "SweepPoint",
    "run_sweep",
    "saturation_index",
    "sweep_table",
    "throughput_latency_figure",
]

QUANTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class SLO:
    """Service-level objectives in seconds: TTFT, TPOT and optionally an end-to-end deadline."""

    ttft_s: float
    tpot_s: float
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s") + (("deadline_s",) if self.deadline_s is not None else ()):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 < value < math.inf
            ):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class PhaseSummary:
    """One phase (cold start or steady state) of a run.

    Latency dicts map a quantile (50, 90, 99) to a :class:`servelab.metrics.latency.Percentile`,
    which carries its sample size and whether that size supports the quantile. ``naive_*`` measure
    from the actual send instead of the plan. ``throughputs`` is None when nothing succeeded; they
    are rates over ``window_s`` = (first arrival, last finish), the drain after the last arrival
    included.
    """

    n_requests: int
    n_ok: int
    ttft: dict[float, metrics.Percentile]
    tpot: dict[float, metrics.Percentile]
    itl: dict[float, metrics.Percentile]
    e2e: dict[float, metrics.Percentile]
    naive_ttft: dict[float, metrics.Percentile]
    naive_e2e: dict[float, metrics.Percentile]
    throughputs: metrics.Throughputs | None
    slo_attainment: float
    goodput_requests_per_s: float
    goodput_tokens_per_s: float
    window_s: tuple[float, float] | None


@dataclass(frozen=True)
class LoadReport:
    """A whole run: how it was driven, its cold and steady phases, and why requests failed.

    ``failures`` maps a reason (an HTTP status such as ``"503"``, or ``"timeout"``,
    ``"connection"``, ``"stream error"``) to a count. ``max_send_lag_s`` is the client's own
    lateness: when it is large the load generator, not the server, was the bottleneck.
    """

    mode: str
    offered_rate: float | None
    concurrency: int | None
    slo: SLO
    cold: PhaseSummary | None
    steady: PhaseSummary | None
    failures: dict[str, int]
    max_send_lag_s: float
    unsent: int


def _percentiles(values: Sequence[float]) -> dict[float, metrics.Percentile]:
    if not values:
        return {}
    with warnings.catch_warnings():
        # the sample-size verdict is kept in Percentile.enough_samples
        warnings.simplefilter("ignore")
        return {q: metrics.percentile(list(values), q) for q in QUANTILES}


def _failure_reason(result: RequestResult) -> str:
    if result.status not in (0, 200):
        return str(result.status)
    error = result.error or "no output"
    if error.startswith("no complete answer"):
        return "timeout"
    return error.split(":")[0]


def _summarize_phase(results: list[RequestResult], slo: SLO) -> PhaseSummary:
    ok = [r for r in results if r.ok]
    timed = [r.timing() for r in ok]
    naive = [r.timing(from_planned=False) for r in ok]
    window = None
    thr = None
    good_rps = good_tps = 0.0
    meeting = 0
    if ok:
        window = (min(r.arrival_s for r in results), max(r.finish_s for r in ok))
        if window[1] > window[0]:
            thr = metrics.throughputs(timed, window)
            good_rps = metrics.goodput(timed, slo.ttft_s, slo.tpot_s, window, slo.deadline_s)
            good_tps = metrics.goodput(
                timed, slo.ttft_s, slo.tpot_s, window, slo.deadline_s, unit="tokens"
            )
        meeting = sum(metrics.meets_slo(t, slo.ttft_s, slo.tpot_s, slo.deadline_s) for t in timed)
    return PhaseSummary(
        n_requests=len(results), n_ok=len(ok),
        ttft=_percentiles([t.ttft for t in timed]),
        tpot=_percentiles([t.tpot for t in timed if t.tpot is not None]),
        itl=_percentiles([gap for t in timed for gap in t.itl]),
        e2e=_percentiles([t.e2e for t in timed]),
        naive_ttft=_percentiles([t.ttft for t in naive]),
        naive_e2e=_percentiles([t.e2e for t in naive]),
        throughputs=thr, slo_attainment=meeting / len(results) if results else 0.0,
        goodput_requests_per_s=good_rps, goodput_tokens_per_s=good_tps, window_s=window)


def summarize(run: RunResult, slo: SLO, warmup_requests: int = 0) -> LoadReport:
    """Report ``run`` against ``slo``; the first ``warmup_requests`` (by plan order) form the cold
    phase.

    SLO attainment is over every request of the phase, failures included (a rejected request did not
    meet its SLO); goodput counts SLO-meeting requests (or their output tokens) per second of the
    phase's window, from its first arrival to its last finish.
    """
    if not isinstance(run, RunResult):
        raise TypeError("run must be a RunResult")
    if not isinstance(slo, SLO):
        raise TypeError("slo must be an SLO")
    if (
        isinstance(warmup_requests, bool)
        or not isinstance(warmup_requests, int)
        or warmup_requests < 0
    ):
        raise ValueError(f"warmup_requests must be an int >= 0, got {warmup_requests!r}")
    results = sorted(run.results, key=lambda r: r.index)
    cold, steady = results[:warmup_requests], results[warmup_requests:]
    failures = dict(Counter(_failure_reason(r) for r in results if not r.ok))
    return LoadReport(
        mode=run.mode, offered_rate=run.offered_rate, concurrency=run.concurrency, slo=slo,
        cold=_summarize_phase(cold, slo) if cold else None,
        steady=_summarize_phase(steady, slo) if steady else None,
        failures=failures, max_send_lag_s=run.max_send_lag_s, unsent=run.unsent)


def _quantile_cells(dist: dict[float, metrics.Percentile]) -> list:
    cells = [dist[q].value * 1000 if q in dist else float("nan") for q in QUANTILES]
    n = dist[QUANTILES[0]].n if dist else 0
    trusted = bool(dist) and dist[QUANTILES[-1]].enough_samples
    return [n, *cells, "yes" if trusted else "no (n < 100)"]


def report_table(report: LoadReport):
    """Latency percentiles (milliseconds) per phase and metric, with n and whether p99 is
    trustworthy."""
    if not isinstance(report, LoadReport):
        raise TypeError("report must be a LoadReport")
    rows = []
    for phase_name, phase in (("cold start", report.cold), ("steady", report.steady)):
        if phase is None:
            continue
        for name, dist in (("TTFT", phase.ttft), ("TPOT", phase.tpot), ("ITL", phase.itl),
                           ("E2E", phase.e2e), ("TTFT from send (naive)", phase.naive_ttft),
                           ("E2E from send (naive)", phase.naive_e2e)):
            rows.append([phase_name, name, *_quantile_cells(dist)])
    return viz_table(
        rows,
        columns=["phase", "metric", "n", "p50 ms", "p90 ms", "p99 ms", "p99 trusted"],
        formats={"p50 ms": ".1f", "p90 ms": ".1f", "p99 ms": ".1f"},
        caption="Latency measured at the client; from the planned arrival unless marked naive",
    )


@dataclass(frozen=True)
class SweepPoint:
    """One rate of a sweep: the offered rate (requests/s) and the run's report."""

    rate: float
    report: LoadReport


async def run_sweep(endpoint: Endpoint, rates: Sequence[float], duration_s: float,
                    prompt_words: LengthDistribution, output_tokens: LengthDistribution, slo: SLO,
                    seed: int = 0, warmup_requests: int = 0, stop_after_saturation: bool = True,
                    time_limit_s: float = 120.0) -> list[SweepPoint]:
    """An open-loop Poisson run of ``duration_s`` seconds at each rate of ``rates`` (ascending).

    Each point uses its own seeded workload; its first ``warmup_requests`` form the cold phase. With
    ``stop_after_saturation`` the sweep ends at the first saturated point (see
    :func:`saturation_index`): past the knee, queues only grow.
    """
    rates = [float(r) for r in rates]
    if not rates or any(not 0 < r < math.inf for r in rates) or rates != sorted(rates):
        raise ValueError(f"rates must be a non-empty ascending list of numbers > 0, got {rates}")
    points: list[SweepPoint] = []
    for i, rate in enumerate(rates):
        rng = np.random.default_rng(seed + i)
        specs = build_workload(
            poisson_arrivals(rate, duration_s, rng), prompt_words, output_tokens, seed + i
        )
        if not specs:
            raise ValueError(
                f"rate {rate}/s over {duration_s} s planned no request; raise duration_s"
            )
        run = await run_open_loop(endpoint, specs, time_limit_s=time_limit_s)
        points.append(SweepPoint(rate, summarize(run, slo, warmup_requests)))
        if stop_after_saturation and saturation_index(points) is not None:
            break
    return points


def saturation_index(points: Sequence[SweepPoint], latency_factor: float = 3.0) -> int | None:
    """Index of the first saturated point, or None.

    Against the lowest rate (the idle baseline), a point is saturated when its p90 TTFT exceeds
    ``latency_factor`` times the baseline's (requests wait in the queue), or its p90 TPOT does (the
    batch grew until every step crawls): in an open loop both grow without bound once arrivals
    outrun the server. A point where nothing succeeded is saturated. p90 rather than p99: short
    sweep points rarely hold the 100 samples a p99 needs.
    """
    if (
        isinstance(latency_factor, bool)
        or not isinstance(latency_factor, (int, float))
        or not latency_factor > 1
    ):
        raise ValueError(f"latency_factor must be a number > 1, got {latency_factor!r}")
    if not points:
        return None
    base = points[0].report.steady
    for i, point in enumerate(points):
        steady = point.report.steady
        if steady is None or not steady.n_ok:
            return i
        if base is None or not base.n_ok:
            continue
        for attr in ("ttft", "tpot"):
            now, idle = getattr(steady, attr), getattr(base, attr)
            if now and idle and now[90.0].value > latency_factor * idle[90.0].value:
                return i
    return None


def _steady_value(point: SweepPoint, attr: str, q: float) -> float:
    steady = point.report.steady
    dist = getattr(steady, attr) if steady else {}
    return dist[q].value if q in dist else float("nan")


def sweep_table(points: Sequence[SweepPoint]):
    """One row per rate: achieved throughputs, TTFT/TPOT percentiles (ms), SLO attainment, goodput.

    ``rate`` is the Poisson rate asked for; ``offered`` the rate the seeded plan actually realised;
    ``done`` the completions per second over the window from first arrival to last finish.
    """
    if not points:
        raise ValueError("points must hold at least one SweepPoint")
    knee = saturation_index(points)
    rows = []
    for i, p in enumerate(points):
        steady = p.report.steady
        thr = steady.throughputs if steady else None
        rows.append({
            "rate req/s": p.rate,
            "offered req/s": p.report.offered_rate or p.rate,
            "done req/s": thr.requests_per_s if thr else 0.0,
            "out tok/s": thr.output_tokens_per_s if thr else 0.0,
            "total tok/s": thr.total_tokens_per_s if thr else 0.0,
            "n": steady.n_ok if steady else 0,
            "TTFT p50 ms": _steady_value(p, "ttft", 50.0) * 1000,
            "TTFT p99 ms": _steady_value(p, "ttft", 99.0) * 1000,
            "TPOT p50 ms": _steady_value(p, "tpot", 50.0) * 1000,
            "TPOT p99 ms": _steady_value(p, "tpot", 99.0) * 1000,
            "SLO met": steady.slo_attainment if steady else 0.0,
            "goodput req/s": steady.goodput_requests_per_s if steady else 0.0,
            "saturated": "knee" if i == knee else ("yes" if knee is not None and i > knee else ""),
        })
    formats = {
        c: ".2f" if c.endswith("req/s") else ".1f" for c in rows[0] if c.endswith(("ms", "/s"))
    }
    return viz_table(
        rows,
        formats=formats | {"SLO met": ".0%"},
        caption="Load sweep, steady state (cold-start requests excluded); latency from planned "
        "arrival",
    )


def throughput_latency_figure(points: Sequence[SweepPoint]) -> go.Figure:
    """Latency (ms) against achieved output-token throughput, one marker per offered rate.

    Four curves: TTFT p50/p99 and TPOT p50/p99. The knee found by :func:`saturation_index` is
    marked; past it, throughput stops rising while latency climbs steeply.
    """
    if not points:
        raise ValueError("points must hold at least one SweepPoint")
    x = [
        p.report.steady.throughputs.output_tokens_per_s
        if p.report.steady and p.report.steady.throughputs
        else 0.0
        for p in points
    ]
    hover = [f"offered {p.rate:.2f} req/s" for p in points]
    fig = go.Figure()
    for attr, q, dash in (("ttft", 50.0, "solid"), ("ttft", 99.0, "dot"), ("tpot", 50.0, "solid"),
                          ("tpot", 99.0, "dot")):
        fig.add_trace(go.Scatter(x=x, y=[_steady_value(p, attr, q) * 1000 for p in points],
                                 mode="lines+markers", name=f"{attr.upper()} p{q:g}", text=hover,
                                 line={"dash": dash}))
    knee = saturation_index(points)
    if knee is not None:
        fig.add_vline(x=x[knee], line_dash="dash", line_color="gray",
                      annotation_text=f"saturation ({points[knee].rate:.2f} req/s offered)")
    fig.update_layout(
        title="Throughput-latency curve (latency from planned arrival)",
        xaxis_title="achieved output tokens/s",
        yaxis_title="latency (ms)",
        yaxis_type="log",
    )
    return fig
