"""The §7 bottleneck-migration figure: decode step time and time per sequence against batch size.

Draws what :func:`servelab.optimizations.step_cost.measure_decode_step` measured and the line
:func:`servelab.optimizations.step_cost.fit_step_cost` fitted; returns a
``plotly.graph_objects.Figure`` (pass it to ``servelab.viz.show``).
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servelab.optimizations.step_cost import StepCostFit

__all__ = ["step_cost_figure"]

MEASURED_COLOR, FIT_COLOR, KNEE_COLOR = "#1b9e77", "#7570b3", "#d95f02"


def step_cost_figure(
    batch_sizes: Sequence[int], step_ms: Sequence[float], fit: StepCostFit
) -> go.Figure:
    """Left: ms per decode step (measured, and ``fixed + per_sequence * B``); right: ms per sequence
    per step. Both on log-log axes, with the knee ``B = fixed / per_sequence`` marked."""
    if len(batch_sizes) != len(step_ms) or not batch_sizes:
        raise ValueError("batch_sizes and step_ms must be non-empty and of equal length")
    sizes = list(batch_sizes)
    line = [fit.fixed + fit.per_sequence * b for b in sizes]
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("ms per decode step", "ms per sequence per step")
    )
    fig.add_trace(go.Scatter(x=sizes, y=list(step_ms), mode="markers+lines", name="measured",
                             marker_color=MEASURED_COLOR), row=1, col=1)
    fig.add_trace(go.Scatter(x=sizes, y=line, mode="lines", name="fixed + per-sequence x B",
                             line=dict(color=FIT_COLOR, dash="dot")), row=1, col=1)
    fig.add_trace(
        go.Scatter(
            x=sizes,
            y=[t / b for t, b in zip(step_ms, sizes)],
            mode="markers+lines",
            name="measured / B",
            marker_color=MEASURED_COLOR,
            showlegend=False,
        ),
        row=1,
        col=2,
    )
    fig.add_trace(
        go.Scatter(
            x=sizes,
            y=[fit.per_sequence] * len(sizes),
            mode="lines",
            name="per-sequence cost (the floor)",
            line=dict(color=FIT_COLOR, dash="dash"),
        ),
        row=1,
        col=2,
    )
    for col in (1, 2):
        fig.add_vline(x=fit.knee_batch, line_color=KNEE_COLOR, line_dash="dash", row=1, col=col)
        fig.update_xaxes(type="log", title_text="sequences in the batch", row=1, col=col)
        fig.update_yaxes(type="log", row=1, col=col)
    fig.update_layout(height=420, title=f"Knee at about {fit.knee_batch:.0f} sequences: fixed "
                      f"{fit.fixed:.2f} ms per step, {fit.per_sequence:.3f} ms per sequence")
    return fig
