"""Figures for the metrics chapter: one request's timeline, a load sweep, the roofline, tail
latency.

Every value drawn comes from :mod:`servelab.metrics.latency` (TTFT, ITL, TPOT, throughput, SLO
attainment, goodput, percentiles) or :mod:`servelab.metrics.roofline` (ridge points, prefill/decode
costs); this module only arranges it. All builders return a ``plotly.graph_objects.Figure``; pass it
to ``servelab.viz.core.show``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servelab import metrics as m
from servelab.metrics import roofline
from servelab.viz.core import slider_figure

__all__ = [
    "latency_percentile_figure",
    "load_sweep_figure",
    "measured_roofline_figure",
    "roofline_batch_slider_figure",
    "roofline_figure",
    "roofline_phase_figure",
    "timeline_figure",
]

TTFT_COLOR = "#d95f0e"
ITL_COLORS = ("#2c7fb8", "#7fcdbb")
QUEUE_COLOR = "#bdbdbd"
SWEEP_COLORS = ("#1f77b4", "#2ca02c", "#d62728")  # throughput, goodput, attainment
UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}


def _scale(unit: str) -> float:
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {tuple(UNITS)}, got {unit!r}")
    return UNITS[unit]


def _span(fig: go.Figure, start: float, end: float, colour: str, name: str, hover: str,
          show_legend: bool) -> None:
    """One horizontal bar on the timeline lane (row 1), from ``start`` to ``end``."""
    fig.add_trace(go.Bar(x=[end - start], base=[start], y=["request"], orientation="h",
                         marker_color=colour, name=name, legendgroup=name, showlegend=show_legend,
                         hovertemplate=hover + "<extra></extra>"), row=1, col=1)


def timeline_figure(timing: m.RequestTiming, *, unit: str = "ms",
                    token_texts: Sequence[str] | None = None) -> go.Figure:
    """One request on a time axis (top) and its inter-token latencies against TPOT (bottom).

    Top lane: queueing (arrival to first scheduled), the rest of TTFT, then one bar per ITL. Bottom:
    ITL_j for j = 2..N with TPOT as a line. The title checks the E2E identity
    ``t_last - t_arrival = TTFT + sum(ITL)``. Times are shown relative to arrival in ``unit``;
    ``token_texts`` (one per emitted token) label the emit markers.
    """
    if not isinstance(timing, m.RequestTiming):
        raise TypeError(
            f"timing must be a servelab.metrics.latency.RequestTiming, got {type(timing).__name__}"
        )
    if timing.output_tokens < 2:
        raise ValueError("timing must hold at least two emitted tokens to show ITL and TPOT")
    k = _scale(unit)
    if token_texts is not None and len(token_texts) != timing.output_tokens:
        raise ValueError(
            f"token_texts must hold one text per emitted token ({timing.output_tokens})"
        )
    emits = [(t - timing.arrival) * k for t in timing.emit_times]
    gaps = [g * k for g in timing.itl]
    ttft, tpot = timing.ttft * k, timing.tpot * k
    fig = make_subplots(rows=2, cols=1, row_heights=[0.35, 0.65], vertical_spacing=0.28,
                        subplot_titles=("request timeline", "inter-token latency per token"))
    _span(fig, 0.0, timing.queue_delay * k, QUEUE_COLOR, "queueing",
          f"queued {timing.queue_delay * k:.2f} {unit}", True)
    _span(fig, timing.queue_delay * k, emits[0], TTFT_COLOR, "TTFT (rest: prefill + first token)",
          f"TTFT {ttft:.2f} {unit}", True)
    for j, (start, gap) in enumerate(zip(emits, gaps), start=2):
        _span(
            fig, start, start + gap, ITL_COLORS[j % 2], "ITL", f"ITL_{j} {gap:.2f} {unit}", j == 2
        )
    labels = token_texts or [str(j) for j in range(1, len(emits) + 1)]
    fig.add_trace(
        go.Scatter(
            x=emits,
            y=["request"] * len(emits),
            mode="markers",
            name="token emitted",
            marker={"symbol": "line-ns-open", "size": 18, "color": "black"},
            text=list(labels),
            hovertemplate="%{text} at %{x:.2f}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    index = list(range(2, len(emits) + 1))
    fig.add_trace(
        go.Bar(
            x=index,
            y=gaps,
            name="ITL_j",
            marker_color=ITL_COLORS[0],
            showlegend=False,
            hovertemplate="ITL_%{x}: %{y:.2f}<extra></extra>",
        ),
        row=2,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=[index[0], index[-1]],
            y=[tpot, tpot],
            mode="lines",
            name=f"TPOT = {tpot:.2f} {unit}",
            line={"dash": "dash", "color": "black"},
        ),
        row=2,
        col=1,
    )
    lhs = (timing.emit_times[-1] - timing.arrival) * k
    holds = m.e2e_identity_holds(timing.arrival, list(timing.emit_times))
    fig.update_layout(
        barmode="overlay",
        legend_orientation="h",
        legend_y=-0.2,
        margin={"t": 90},
        height=520,
        title=f"t_last − t_arrival = {lhs:.2f} {unit}; TTFT + ΣITL = "
        f"{ttft + sum(gaps):.2f} {unit} (the identity {'holds' if holds else 'fails'})",
    )
    fig.update_xaxes(title_text=f"time since arrival ({unit})", row=1, col=1)
    fig.update_xaxes(title_text="output token j", row=2, col=1)
    fig.update_yaxes(title_text=unit, row=2, col=1)
    return fig


SWEEP_CURVES = ("throughput", "goodput", "attainment")


def _band_trace(
    x: np.ndarray, low: np.ndarray, high: np.ndarray, name: str, colour: str
) -> go.Scatter:
    """A shaded polygon from ``low`` to ``high`` over ``x``, in the legend group of its curve."""
    return go.Scatter(
        x=np.concatenate([x, x[::-1]]),
        y=np.concatenate([high, low[::-1]]),
        fill="toself",
        fillcolor=colour,
        line={"width": 0},
        opacity=0.25,
        hoverinfo="skip",
        name=f"{name} (min-max)",
        legendgroup=name,
        showlegend=False,
    )


def _sweep_bands(bands: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None, size: int,
                 curves: Mapping[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for name, (low, high) in (bands or {}).items():
        if name not in SWEEP_CURVES:
            raise ValueError(f"bands keys must be among {SWEEP_CURVES}, got {name!r}")
        lo, hi = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
        if lo.shape != (size,) or hi.shape != (size,):
            raise ValueError(f"bands[{name!r}] must hold two sequences as long as offered")
        if (lo > curves[name] + 1e-12).any() or (hi < curves[name] - 1e-12).any():
            raise ValueError(f"bands[{name!r}] must enclose its curve (low <= value <= high)")
        out[name] = (lo, hi)
    return out


def load_sweep_figure(
    offered: Sequence[float],
    throughput: Sequence[float],
    goodput: Sequence[float],
    attainment: Sequence[float],
    *,
    rate_unit: str = "requests/s",
    bands: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
) -> go.Figure:
    """Throughput and goodput (rates, top) and SLO attainment (a fraction, bottom) against offered
    load.

    The three curves share the x axis but not the y axis on purpose: goodput is a rate, attainment
    a dimensionless fraction. ``bands`` maps a curve name in ``SWEEP_CURVES`` to ``(low, high)``
    sequences (for example min and max over seeds), drawn as a shaded band around the curve.
    """
    series = [np.asarray(s, dtype=float) for s in (offered, throughput, goodput, attainment)]
    if len({s.shape for s in series}) != 1 or series[0].ndim != 1 or series[0].size < 2:
        raise ValueError(
            "offered, throughput, goodput and attainment must be 1-D and equally long (>= 2)"
        )
    if ((series[3] < 0) | (series[3] > 1)).any():
        raise ValueError("attainment must be a fraction in [0, 1]")
    x, thr, good, att = series
    shaded = _sweep_bands(bands, x.size, dict(zip(SWEEP_CURVES, (thr, good, att))))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        row_heights=[0.6, 0.4])
    fig.add_trace(go.Scatter(x=x, y=x, mode="lines", name="offered load", line={"dash": "dot",
                                                                                "color": "grey"}),
                  row=1, col=1)
    for name, y, colour, row in zip(SWEEP_CURVES, (thr, good, att), SWEEP_COLORS, (1, 1, 2)):
        if name in shaded:
            fig.add_trace(_band_trace(x, *shaded[name], name, colour), row=row, col=1)
        label = "SLO attainment" if name == "attainment" else name
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=label, legendgroup=name,
                                 line={"color": colour}), row=row, col=1)
    fig.update_yaxes(title_text=rate_unit, row=1, col=1)
    fig.update_yaxes(title_text="fraction", range=[0, 1.05], row=2, col=1)
    fig.update_xaxes(title_text=f"offered load ({rate_unit})", row=2, col=1)
    fig.update_layout(legend_orientation="h", legend_y=-0.15)
    return fig


def _check_devices(devices: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Ridge point of every ``name -> (peak FLOP/s, bytes/s)``; rejects an empty mapping."""
    if not devices:
        raise ValueError("devices must name at least one (peak FLOP/s, bytes/s) pair")
    return {name: roofline.ridge_point(*spec) for name, spec in devices.items()}


def _ceiling_trace(name: str, peak: float, bandwidth: float, grid: np.ndarray) -> go.Scatter:
    flops = [roofline.attainable_flops(float(i), peak, bandwidth) for i in grid]
    return go.Scatter(x=grid, y=flops, mode="lines", name=f"{name} roof",
                      hovertemplate="I = %{x:.3g} FLOP/B → %{y:.3g} FLOP/s<extra></extra>")


def _intensity_grid(values: Sequence[float]) -> np.ndarray:
    low, high = min(values), max(values)
    return np.logspace(np.log10(low / 4), np.log10(high * 4), 200)


def _ridge_traces(ridges: Mapping[str, float], y_span: tuple[float, float]) -> list[go.Scatter]:
    """One dotted vertical line per ridge point, named in the legend (no free text to collide)."""
    return [
        go.Scatter(
            x=[ridge, ridge],
            y=list(y_span),
            mode="lines",
            name=f"{name} ridge I* = {ridge:.1f}",
            line={"dash": "dot", "color": "grey", "width": 1.5},
            hovertemplate=f"{name} ridge point: {ridge:.1f} FLOP/B<extra></extra>",
        )
        for name, ridge in ridges.items()
    ]


def _point_trace(
    label: str, intensity: float, flops: float, hover: str | None = None
) -> go.Scatter:
    """A kernel or phase as a marked point named in the legend: squares for prefill, circles
    otherwise."""
    return go.Scatter(
        x=[intensity],
        y=[flops],
        mode="markers",
        name=label,
        marker={"size": 12, "symbol": "square" if label.endswith("prefill") else "circle"},
        hovertemplate=hover or f"{label}: I = %{{x:.3g}} FLOP/B<extra></extra>",
    )


def _roofline_layout(fig: go.Figure) -> go.Figure:
    """Log axes; the legend names every roof, ridge and point, to the right of the plot."""
    fig.update_layout(
        xaxis_type="log",
        yaxis_type="log",
        xaxis_title="arithmetic intensity (FLOP/byte)",
        yaxis_title="attainable FLOP/s (upper bound)",
        margin={"t": 40},
        legend={"x": 1.02, "y": 1, "xanchor": "left", "yanchor": "top"},
    )
    return fig


def roofline_figure(devices: Mapping[str, tuple[float, float]],
                    kernels: Mapping[str, float] | None = None) -> go.Figure:
    """Roofline ceilings ``min(peak, I x bandwidth)`` with ridge points, and optional kernels.

    ``devices`` maps a name to ``(peak FLOP/s, memory bytes/s)``; ``kernels`` maps a name to its
    arithmetic intensity (FLOP/byte), placed on the first device's roof. An upper bound, not a
    latency prediction.
    """
    kernels = dict(kernels or {})
    fig = _roofs(devices, kernels.values())
    peak, bandwidth = next(iter(devices.values()))
    for name, intensity in kernels.items():
        fig.add_trace(
            _point_trace(name, intensity, roofline.attainable_flops(intensity, peak, bandwidth))
        )
    return _roofline_layout(fig)


def _roofs(devices: Mapping[str, tuple[float, float]], intensities: Iterable[float],
           lowest_flops: float = math.inf) -> go.Figure:
    """Every device's roof over a grid spanning its ridge and ``intensities``, with its ridge line
    drawn down to ``lowest_flops`` (FLOP/s) or the lowest roof, whichever is lower."""
    ridges = _check_devices(devices)
    grid = _intensity_grid([*ridges.values(), *intensities])
    fig = go.Figure([_ceiling_trace(name, *spec, grid) for name, spec in devices.items()])
    floor = min(lowest_flops, *(float(grid[0]) * b for _, b in devices.values()))
    fig.add_traces(_ridge_traces(ridges, (floor, max(p for p, _ in devices.values()))))
    return fig


def measured_roofline_figure(devices: Mapping[str, tuple[float, float]],
                             measured: Mapping[str, tuple[float, float]]) -> go.Figure:
    """Roofs and ridge points of ``devices`` (``name -> (peak FLOP/s, bytes/s)``, as in
    :func:`roofline_figure`) with measured steps placed where they ran: ``measured`` maps a name to
    ``(arithmetic intensity FLOP/byte, achieved FLOP/s)``. The gap between a point and the roof
    above it is what that step left unused."""
    if not measured:
        raise ValueError("measured must name at least one (intensity, achieved FLOP/s) point")
    fig = _roofs(devices, [i for i, _ in measured.values()], min(f for _, f in measured.values()))
    for name, (intensity, flops) in measured.items():
        fig.add_trace(
            _point_trace(
                name,
                intensity,
                flops,
                f"{name}: I = %{{x:.3g}} FLOP/B, %{{y:.3g}} FLOP/s measured<extra></extra>",
            )
        )
    return _roofline_layout(fig)


Workloads = Mapping[str, tuple[roofline.ModelShape, int, int]]
"""Model name -> ``(shape, prompt tokens, cached context tokens per decode step)``."""


def _phase_costs(workloads: Workloads, batch: int) -> dict[str, roofline.PhaseCost]:
    """``"<model> prefill"`` and ``"<model> decode"`` costs of every workload at one batch size."""
    if not workloads:
        raise ValueError("workloads must name at least one (ModelShape, prompt_len, context_len)")
    costs = {}
    for name, (shape, prompt_len, context_len) in workloads.items():
        costs[f"{name} prefill"] = roofline.prefill_cost(shape, prompt_len, batch)
        costs[f"{name} decode"] = roofline.decode_cost(shape, context_len, batch)
    return costs


def roofline_phase_figure(device: tuple[str, float, float], workloads: Workloads, *, batch: int,
                          intensity_range: tuple[float, float] | None = None) -> go.Figure:
    """One device's roof with every workload's prefill (square) and decode (circle) point at
    ``batch``.

    ``device`` is ``(name, peak FLOP/s, bytes/s)``; ``workloads`` maps a model name to
    ``(ModelShape, prompt_len, context_len)``. Costs come from
    :func:`servelab.metrics.roofline.prefill_cost` and
    :func:`~servelab.metrics.roofline.decode_cost`. ``intensity_range`` fixes the x axis
    (FLOP/byte), so the frames of a slider share one axis.
    """
    name, peak, bandwidth = device
    ridges = _check_devices({name: (peak, bandwidth)})
    costs = _phase_costs(workloads, batch)
    low, high = intensity_range or (min(c.intensity for c in costs.values()) / 4,
                                    max(c.intensity for c in costs.values()) * 4)
    grid = np.logspace(np.log10(low), np.log10(high), 200)
    fig = go.Figure(_ceiling_trace(name, peak, bandwidth, grid))
    y_span = (low * bandwidth / 2, peak * 2)
    fig.add_traces(_ridge_traces(ridges, y_span))
    for label, cost in costs.items():
        fig.add_trace(
            _point_trace(
                label,
                cost.intensity,
                roofline.attainable_flops(cost.intensity, peak, bandwidth),
                f"{label}, batch {batch}: I = %{{x:.3g}} FLOP/B<extra></extra>",
            )
        )
    fig.update_layout(title=f"batch size {batch}", xaxis_range=[np.log10(low), np.log10(high)],
                      yaxis_range=[np.log10(y_span[0]), np.log10(y_span[1])])
    return _roofline_layout(fig)


def roofline_batch_slider_figure(device: tuple[str, float, float], workloads: Workloads,
                                 batches: Sequence[int]) -> go.Figure:
    """:func:`roofline_phase_figure` with a slider over the batch size; every frame computed now.

    The x axis spans every frame's points, so moving the slider moves the points, not the axes.
    """
    if len(batches) < 2 or any(
        isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batches
    ):
        raise ValueError("batches must hold at least two ints >= 1")
    _, peak, bandwidth = device
    ridge = roofline.ridge_point(peak, bandwidth)
    intensities = [c.intensity for b in batches for c in _phase_costs(workloads, b).values()]
    span = (min([*intensities, ridge]) / 4, max([*intensities, ridge]) * 4)
    return slider_figure(
        lambda b: roofline_phase_figure(device, workloads, batch=b, intensity_range=span),
        list(batches), label="batch size")


def latency_percentile_figure(
    samples: Mapping[str, Sequence[float]],
    quantiles: Sequence[float] = (50, 90, 99),
    *,
    unit: str = "ms",
) -> go.Figure:
    """Grouped bars: the same quantiles of several latency samples (seconds in, ``unit`` shown).

    Each bar's hover gives the sample size that :func:`servelab.metrics.latency.percentile` reports.
    """
    if not samples:
        raise ValueError("samples must name at least one latency sample")
    k = _scale(unit)
    fig = go.Figure()
    for name, values in samples.items():
        stats = [m.percentile(list(values), q) for q in quantiles]
        fig.add_trace(
            go.Bar(
                x=[f"p{q:g}" for q in quantiles],
                y=[s.value * k for s in stats],
                name=name,
                customdata=[s.n for s in stats],
                hovertemplate="%{x}: %{y:.1f} " + unit + " (n = %{customdata})<extra></extra>",
            )
        )
    fig.update_layout(barmode="group", yaxis_title=f"latency ({unit}, log scale)", yaxis_type="log",
                      legend_orientation="h", legend_y=-0.2)
    return fig
