"""Figures for the topics where today's engines go past the course's core model: DistServe's
goodput search, MoE weight reads per decode step, KV offload tiers, draft acceptance length and
ring vs one-shot all-reduce.

Every builder draws numbers computed by the library (:mod:`servelab.bench.goodput_search`,
:mod:`servelab.metrics.roofline.moe`, :mod:`servelab.kv.offload`, :mod:`servelab.metrics.capacity`,
:mod:`servelab.cluster.parallelism`) and returns a ``plotly.graph_objects.Figure``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from servelab.bench.goodput_search import GoodputSearch

__all__ = ["acceptance_length_figure", "allreduce_figure", "goodput_search_figure",
           "moe_weight_read_figure", "offload_tier_figure"]

PALETTE = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")


def goodput_search_figure(search: GoodputSearch) -> go.Figure:
    """Worst-seed SLO attainment at every simulated rate, the target line, and the goodput found."""
    if not isinstance(search, GoodputSearch):
        raise ValueError("search must be a GoodputSearch")
    fig = go.Figure([
        go.Scatter(x=list(search.rates), y=list(search.worst_attainment), mode="lines+markers",
                   name="attainment (worst seed)", line={"color": PALETTE[2]},
                   hovertemplate="%{x:.2f} req/s: %{y:.3f}<extra></extra>"),
        go.Scatter(x=[min(search.rates), max(search.rates)], y=[search.target] * 2, mode="lines",
                   name=f"target {search.target:.0%}", line={"color": PALETTE[1], "dash": "dash"}),
        go.Scatter(x=[search.goodput] * 2, y=[0, 1], mode="lines", name="DistServe goodput",
                   line={"color": PALETTE[0]},
                   hovertemplate=f"goodput {search.goodput:.2f} req/s<extra></extra>"),
    ])
    fig.update_layout(height=380,
                      title="Goodput as a capacity: the highest rate meeting the target",
                      xaxis_title="offered load (requests/s)", yaxis_title="SLO attainment",
                      yaxis_range=[0, 1.02], legend={"orientation": "h", "y": -0.25})
    return fig


def moe_weight_read_figure(batches: Sequence[int],
                           curves: Mapping[str, Sequence[float]]) -> go.Figure:
    """Weight bytes (GB) one decode step reads against the batch, one line per model."""
    if not batches or not curves:
        raise ValueError("batches and curves must be non-empty")
    fig = go.Figure([go.Scatter(x=list(batches), y=[v / 1e9 for v in ys], mode="lines+markers",
                                name=name, line={"color": PALETTE[i % len(PALETTE)]},
                                hovertemplate="batch %{x}: %{y:.1f} GB<extra></extra>")
                     for i, (name, ys) in enumerate(curves.items())])
    fig.update_layout(height=400, title="Weight bytes one decode step reads",
                      xaxis={"title": "decode batch (tokens)", "type": "log"},
                      yaxis_title="GB per step", legend={"orientation": "h", "y": -0.25})
    return fig


def offload_tier_figure(tokens: Sequence[int], reload_s: Mapping[str, Sequence[float]],
                        recompute_s: Sequence[float]) -> go.Figure:
    """Seconds to bring a context's KV back from each tier, and to recompute it, vs its length."""
    if not tokens or not reload_s:
        raise ValueError("tokens and reload_s must be non-empty")
    fig = go.Figure([go.Scatter(x=list(tokens), y=[s * 1e3 for s in ys], mode="lines",
                                name=f"reload from {name}",
                                line={"color": PALETTE[i % len(PALETTE)]},
                                hovertemplate="%{x} tokens: %{y:.2f} ms<extra></extra>")
                     for i, (name, ys) in enumerate(reload_s.items())])
    fig.add_trace(go.Scatter(x=list(tokens), y=[s * 1e3 for s in recompute_s], mode="lines",
                             name="recompute (prefill)", line={"color": "black", "dash": "dash"},
                             hovertemplate="%{x} tokens: %{y:.2f} ms<extra></extra>"))
    fig.update_layout(height=420, title="Reload or recompute a context's KV",
                      xaxis={"title": "context (tokens)", "type": "log"},
                      yaxis={"title": "ms", "type": "log"}, legend={"orientation": "h", "y": -0.3})
    return fig


def acceptance_length_figure(rates: Sequence[float],
                             lengths: Mapping[int, Sequence[float]]) -> go.Figure:
    """Mean acceptance length (tokens per verify) against per-token acceptance, per draft length."""
    if not rates or not lengths:
        raise ValueError("rates and lengths must be non-empty")
    fig = go.Figure([go.Scatter(x=list(rates), y=list(ys), mode="lines", name=f"k = {k} drafted",
                                line={"color": PALETTE[i % len(PALETTE)]},
                                hovertemplate="a = %{x:.2f}: %{y:.2f} tokens<extra></extra>")
                     for i, (k, ys) in enumerate(lengths.items())])
    fig.update_layout(height=400, title="What acceptance buys: tokens per target forward pass",
                      xaxis_title="per-token acceptance rate a",
                      yaxis_title="mean acceptance length (tokens per verify)",
                      legend={"orientation": "h", "y": -0.25})
    return fig


def allreduce_figure(world_sizes: Sequence[int],
                     seconds: Mapping[str, Sequence[float]]) -> go.Figure:
    """Microseconds of one all-reduce against the number of ranks, one line per algorithm."""
    if not world_sizes or not seconds:
        raise ValueError("world_sizes and seconds must be non-empty")
    fig = go.Figure([go.Scatter(x=list(world_sizes), y=[s * 1e6 for s in ys], mode="lines+markers",
                                name=name, line={"color": PALETTE[i % len(PALETTE)]},
                                hovertemplate="t = %{x}: %{y:.1f} us<extra></extra>")
                     for i, (name, ys) in enumerate(seconds.items())])
    fig.update_layout(height=380, title="One decode all-reduce: ring vs one-shot",
                      xaxis_title="ranks t", yaxis_title="microseconds per all-reduce",
                      legend={"orientation": "h", "y": -0.25})
    return fig
