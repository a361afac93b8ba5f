"""Figures of the cluster chapter (§6): routing under load, TP, PP, EP, disaggregation, multi-LoRA.

Every builder draws numbers computed by :mod:`servelab.cluster`, :mod:`servelab.cluster.adapters` or
:mod:`servelab.cluster.routing` and returns a ``plotly.graph_objects.Figure`` (pass it to
``servelab.viz.show``). Builders meant for sliders take one state and keep the same traces for every
state, as :func:`servelab.viz.core.slider_figure` requires.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servelab import prose
from servelab.cluster.adapters import AdapterSimResult
from servelab.cluster import (
    Accelerator,
    TPStep,
    disaggregation_estimate,
    pipeline_schedule,
    pp_bubble_fraction,
)
from servelab.metrics.roofline import ModelShape
from servelab.cluster.routing import RoutingResult

__all__ = [
    "adapter_capacity_figure",
    "disaggregation_figure",
    "ep_load_figure",
    "pipeline_figure",
    "routing_load_figure",
    "tp_figure",
]

PALETTE = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")


def routing_load_figure(sweep: Mapping[float, Sequence[RoutingResult]]) -> go.Figure:
    """Mean and p95 completion time (ms) per routing policy against offered load (requests per
    second).

    ``sweep`` maps an arrival rate to the results of every policy on that workload.
    """
    if not sweep:
        raise ValueError("sweep must hold at least one arrival rate")
    rates = sorted(sweep)
    policies = [r.policy for r in sweep[rates[0]]]
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("mean completion (ms)", "p95 completion (ms)")
    )
    for i, policy in enumerate(policies):
        by_rate = [{r.policy: r for r in sweep[rate]}[policy] for rate in rates]
        style = {"color": PALETTE[i % len(PALETTE)]}
        fig.add_trace(
            go.Scatter(
                x=rates,
                y=[r.mean_completion_ms for r in by_rate],
                name=policy,
                line=style,
                legendgroup=policy,
                mode="lines+markers",
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=rates,
                y=[r.completion_percentile_ms(95) for r in by_rate],
                name=policy,
                line=style,
                legendgroup=policy,
                showlegend=False,
                mode="lines+markers",
            ),
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text="offered load (requests/s)")
    fig.update_yaxes(type="log")
    fig.update_layout(height=420, title="Four routers on the same workload as the load rises",
                      legend={"orientation": "h", "y": -0.25})
    return fig


def tp_figure(steps: Sequence[TPStep], title: str) -> go.Figure:
    """Stacked bars per TP degree: one rank's compute time and the all-reduce time of one decode
    step (ms)."""
    if not steps:
        raise ValueError("steps must hold at least one TPStep")
    x = [f"TP={s.tp}" for s in steps]
    fig = go.Figure(
        [
            go.Bar(
                x=x,
                y=[s.compute_s * 1e3 for s in steps],
                name="compute (one rank's share)",
                marker_color=PALETTE[0],
                hovertemplate="%{x}: %{y:.3f} ms<extra>compute</extra>",
            ),
            go.Bar(
                x=x,
                y=[s.comm_s * 1e3 for s in steps],
                name="all-reduce (2 per layer)",
                marker_color=PALETTE[1],
                hovertemplate="%{x}: %{y:.3f} ms<extra>communication</extra>",
            ),
        ]
    )
    top = max(s.total_s for s in steps) * 1e3
    fig.update_layout(barmode="stack", height=400, title=title, yaxis_title="ms per decode step",
                      yaxis_range=[0, top * 1.1], legend={"orientation": "h", "y": -0.2})
    return fig


def pipeline_figure(stages: int, microbatches: int) -> go.Figure:
    """The forward-only pipeline schedule as a grid: stage (rows) by time slot (columns), bubbles
    blank."""
    grid = pipeline_schedule(stages, microbatches)
    slots = len(grid[0])
    text = [["" if v is None else f"mb {v}" for v in row] for row in grid]
    fig = go.Figure(
        go.Heatmap(
            z=grid,
            x=list(range(slots)),
            y=[f"stage {s}" for s in range(stages)],
            text=text,
            texttemplate="%{text}",
            colorscale="Viridis",
            showscale=False,
            xgap=2,
            ygap=2,
            hovertemplate="slot %{x}, %{y}: %{text}<extra></extra>",
        )
    )
    bubble = pp_bubble_fraction(stages, microbatches)
    fig.update_layout(
        height=80 + 55 * stages,
        xaxis_title="time slot (one stage's forward of one micro-batch)",
        yaxis_autorange="reversed",
        title=f"{prose.count(stages, 'stage')} (p), "
        f"{prose.count(microbatches, 'micro-batch', 'micro-batches')}"
        f" (m): bubble (p - 1) / (m + p - 1) = {bubble:.1%}",
    )
    return fig


def ep_load_figure(loads: Sequence[int], skew: float, cap: float) -> go.Figure:
    """Token-expert assignments per EP rank, with the mean as a dashed line; y-axis fixed at
    ``cap``."""
    if not loads:
        raise ValueError("loads must hold at least one rank")
    mean = sum(loads) / len(loads)
    fig = go.Figure([
        go.Bar(x=[f"rank {i}" for i in range(len(loads))], y=list(loads), marker_color=PALETTE[2],
               name="assignments", hovertemplate="%{x}: %{y}<extra></extra>"),
        go.Scatter(x=[f"rank {i}" for i in range(len(loads))], y=[mean] * len(loads), mode="lines",
                   line={"dash": "dash", "color": PALETTE[1]}, name="mean"),
    ])
    fig.update_layout(height=380, yaxis_range=[0, cap], yaxis_title="token-expert assignments",
                      title=f"skew {skew:g}: busiest rank / mean = {max(loads) / mean:.2f}",
                      legend={"orientation": "h", "y": -0.2})
    return fig


def disaggregation_figure(model: ModelShape, device: Accelerator, prompts: Sequence[int], *,
                          bandwidth_gbs: float, decode_streams: int, latency_ms: float,
                          decode_context: int = 1024, mfu: float = 0.5) -> go.Figure:
    """Delay removed (stall x streams) and delay added (KV transfer) per prompt length, in ms, log
    axes.

    Link bandwidth in GB/s (1e9 bytes/s), latency in ms; everything else from
    :func:`servelab.cluster.disaggregation_estimate` (compute at model-FLOP utilisation ``mfu``).
    """
    est = [
        disaggregation_estimate(
            model,
            p,
            device,
            bandwidth_gbs * 1e9,
            latency_ms / 1e3,
            decode_streams,
            decode_context,
            mfu,
        )
        for p in prompts
    ]
    wins = [e.prompt_tokens for e in est if e.worth_it]
    verdict = f"pays from {min(wins):,} prompt tokens" if wins else "never pays in this range"
    fig = go.Figure(
        [
            go.Scatter(
                x=list(prompts),
                y=[max(e.saved_s * 1e3, 1e-3) for e in est],
                mode="lines+markers",
                name=f"decode stall removed ({decode_streams} streams)",
                line={"color": PALETTE[0]},
            ),
            go.Scatter(
                x=list(prompts),
                y=[e.transfer_s * 1e3 for e in est],
                mode="lines+markers",
                name="KV transfer added to TTFT",
                line={"color": PALETTE[1]},
            ),
        ]
    )
    fig.update_layout(
        height=420,
        xaxis={"type": "log", "title": "prompt tokens"},
        yaxis={"type": "log", "title": "ms", "range": [-3, 4.5]},
        title=f"{bandwidth_gbs:g} GB/s link, {latency_ms:g} ms latency: disaggregation {verdict}",
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def adapter_capacity_figure(results: Mapping[str, Mapping[int, AdapterSimResult]]) -> go.Figure:
    """GPU adapter-cache hit rate (left) and cold loads (right) against adapter slots, one line per
    workload."""
    if not results:
        raise ValueError("results must hold at least one workload")
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("GPU adapter hit rate", "cold loads (host->GPU)")
    )
    for i, (label, by_slots) in enumerate(results.items()):
        slots = sorted(by_slots)
        style = {"color": PALETTE[i % len(PALETTE)]}
        fig.add_trace(
            go.Scatter(
                x=slots,
                y=[by_slots[s].gpu_hit_rate for s in slots],
                name=label,
                line=style,
                legendgroup=label,
                mode="lines+markers",
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=slots,
                y=[by_slots[s].cold_loads for s in slots],
                name=label,
                line=style,
                legendgroup=label,
                showlegend=False,
                mode="lines+markers",
            ),
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text="GPU adapter slots")
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02], row=1, col=1)
    fig.update_layout(height=420, title="Multi-LoRA: what a bigger adapter cache buys",
                      legend={"orientation": "h", "y": -0.25})
    return fig
