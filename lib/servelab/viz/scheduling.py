"""Figures and tables for the scheduling chapter: Gantt charts of the tick simulations and of real
engine runs, one engine tick laid out in the eight steps of a scheduler iteration, the
chunked-prefill trade-off and the admission limits.

Inputs are the library's own records: ``servelab.scheduling.batching.TickRecord`` lists and
``IterationTrace`` objects from the simulations, ``servelab.engine.StepRecord`` lists from
``LLMEngine.trace``. This module only arranges them; every builder returns a
``plotly.graph_objects.Figure`` (or a :class:`servelab.viz.core.Table`) for ``servelab.viz.show``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servelab import prose
from servelab.scheduling.batching import IterationTrace, TickRecord
from servelab.engine.trace import StepRecord
from servelab.viz.core import Table, table

__all__ = [
    "EIGHT_STEPS",
    "admission_limits_figure",
    "batch_composition_figure",
    "batching_gain_figure",
    "chunked_prefill_figure",
    "engine_gantt_figure",
    "iteration_gantt_figure",
    "tick_gantt_figure",
    "tick_walkthrough",
]

EMIT_COLOR = "#2c7fb8"
STALL_COLOR = "#a6bddb"
QUEUE_COLOR = "#d9d9d9"
PREFILL_COLOR = "#d95f0e"
DECODE_COLOR = "#2c7fb8"
RUNNING_COLOR = "#1b9e77"
WAITING_COLOR = "#d95f02"
HELD_COLOR = "#7570b3"
RECOMPUTE_COLOR = "#e7298a"

EIGHT_STEPS = (
    "1. reclaim requests that ended",
    "2. admit from the queue",
    "3. split the token budget",
    "4. run one forward pass",
    "5. sample the rows that owe a token",
    "6. emit text to clients",
    "7. check stop conditions",
    "8. preempt when KV is short",
)
"""The eight parts of one scheduler iteration, in the order a walk-through explains them."""


def _lanes(names: Sequence[str]) -> list[str]:
    names = list(dict.fromkeys(names))
    if not names:
        raise ValueError("nothing to draw: no request appears in the records")
    return names


def _cell_bars(fig: go.Figure, cells: Mapping[str, list[tuple[float, float, str]]], colour: str,
               name: str, row: int, show_legend: bool) -> None:
    """One horizontal bar trace: ``cells[lane]`` holds (start, width, hover) triples."""
    lanes = [lane for lane, items in cells.items() for _ in items]
    starts = [s for items in cells.values() for s, _, _ in items]
    widths = [w for items in cells.values() for _, w, _ in items]
    hovers = [h for items in cells.values() for _, _, h in items]
    fig.add_trace(
        go.Bar(
            y=lanes or [None],
            x=widths or [0],
            base=starts or [0],
            orientation="h",
            marker={"color": colour, "line": {"color": "#ffffff", "width": 1}},
            name=name,
            legendgroup=name,
            showlegend=show_legend,
            hovertext=hovers or None,
            hoverinfo="text",
        ),
        row=row,
        col=1,
    )


LANE_PX, PANEL_GAP_PX = 24, 60
"""Height of one request lane and the gap between stacked panels (room for the next panel's
title)."""


def _stacked_panels(n_panels: int, n_lanes: int) -> tuple[int, float]:
    """Plot height in pixels and make_subplots' vertical_spacing for panels of ``n_lanes`` lanes."""
    plot_px = LANE_PX * n_lanes * n_panels + PANEL_GAP_PX * (n_panels - 1)
    return plot_px, PANEL_GAP_PX / plot_px if n_panels > 1 else 0.0


def _stacked_layout(fig: go.Figure, title: str, plot_px: int) -> None:
    """Title on top, the legend in one row between it and the first panel's title, no slack
    below."""
    fig.update_layout(
        barmode="overlay",
        title={"text": title, "yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 14}},
        height=plot_px + 110 + 70,
        margin={"t": 110, "b": 70},
        legend={"orientation": "h", "x": 0, "y": 1 + 34 / plot_px, "yanchor": "bottom"},
    )


def tick_gantt_figure(traces: Mapping[str, Sequence[TickRecord]], *, title: str = "") -> go.Figure:
    """One Gantt panel per policy from ``simulate_batching``/``simulate_queue_policies`` traces.

    Each request gets a lane; a tick is dark when the request emits a token, light when it holds a
    slot without emitting, grey while it waits in the queue.
    """
    if not traces:
        raise ValueError("traces must map at least one policy name to its TickRecord list")
    names = _lanes(n for trace in traces.values() for rec in trace for n in rec.active + rec.queued)
    plot_px, spacing = _stacked_panels(len(traces), len(names))
    fig = make_subplots(rows=len(traces), cols=1, shared_xaxes=True, vertical_spacing=spacing,
                        subplot_titles=list(traces))
    for row, (policy, trace) in enumerate(traces.items(), start=1):
        kinds: dict[str, dict[str, list]] = {
            k: {n: [] for n in names} for k in ("emit", "stall", "queue")
        }
        for rec in trace:
            for n in rec.active:
                kind = "emit" if n in rec.emitting else "stall"
                kinds[kind][n].append((rec.tick, 1, f"{n}, tick {rec.tick}: {kind}"))
            for n in rec.queued:
                kinds["queue"][n].append((rec.tick, 1, f"{n}, tick {rec.tick}: queued"))
        for kind, colour, label in (("emit", EMIT_COLOR, "emits a token"),
                                    ("stall", STALL_COLOR, "holds a slot, no token"),
                                    ("queue", QUEUE_COLOR, "queued")):
            _cell_bars(fig, kinds[kind], colour, label, row, row == 1)
        fig.update_yaxes(categoryorder="array", categoryarray=names[::-1], row=row, col=1)
    fig.update_xaxes(title_text="tick", dtick=1, row=len(traces), col=1)
    _stacked_layout(fig, title, plot_px)
    return fig


def _request_ids(records: Sequence[StepRecord]) -> list[str]:
    return _lanes(s for r in records for s in (*r.prefill_tokens, *r.decode_tokens))


def engine_gantt_figure(runs: Mapping[str, Sequence[StepRecord]], *, unit_ms: bool = True,
                        title: str = "") -> go.Figure:
    """Gantt charts of real engine runs, one panel per run, on a shared time axis.

    Every engine step a request takes part in is a bar from the step's start to its end
    (milliseconds from the run's first step, or step numbers with ``unit_ms=False``): orange for
    prefill tokens, blue for a decode token. White space in a lane is time the request was not in
    the batch.
    """
    if not runs or any(not records for records in runs.values()):
        raise ValueError("runs must map each run name to a non-empty list of StepRecord")
    names = _lanes(n for records in runs.values() for n in _request_ids(records))
    plot_px, spacing = _stacked_panels(len(runs), len(names))
    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, vertical_spacing=spacing,
                        subplot_titles=list(runs))
    for row, records in enumerate(runs.values(), start=1):
        origin = records[0].start
        cells: dict[str, dict[str, list]] = {
            "prefill": {n: [] for n in names},
            "decode": {n: [] for n in names},
        }
        for rec in records:
            start = (rec.start - origin) * 1e3 if unit_ms else rec.step
            width = rec.duration * 1e3 if unit_ms else 1
            for kind, counts in (("prefill", rec.prefill_tokens), ("decode", rec.decode_tokens)):
                for n, count in counts.items():
                    cells[kind][n].append(
                        (
                            start,
                            width,
                            f"{n}, step {rec.step}: {prose.count(count, f'{kind} token')}, "
                            f"batch of {rec.num_batched_tokens}",
                        )
                    )
        _cell_bars(fig, cells["prefill"], PREFILL_COLOR, "prefill", row, row == 1)
        _cell_bars(fig, cells["decode"], DECODE_COLOR, "decode", row, row == 1)
        fig.update_yaxes(categoryorder="array", categoryarray=names[::-1], row=row, col=1)
    fig.update_xaxes(
        title_text="ms since the first step" if unit_ms else "engine step", row=len(runs), col=1
    )
    _stacked_layout(fig, title, plot_px)
    return fig


def iteration_gantt_figure(trace: IterationTrace, *, title: str = "",
                           time_range: float | None = None) -> go.Figure:
    """Gantt chart of ``simulate_iterations``: one lane per request, one bar per iteration it joins.

    Bars span the iteration's simulated duration in ticks; orange = a prefill chunk (its size in the
    hover text), blue = a decode token. ``time_range`` fixes the time axis (ticks), so that several
    traces behind one slider share it.
    """
    if not isinstance(trace, IterationTrace):
        raise TypeError(f"trace must be an IterationTrace, got {type(trace).__name__}")
    names = _lanes(r.name for r in trace.requests)
    cells: dict[str, dict[str, list]] = {
        "prefill": {n: [] for n in names},
        "decode": {n: [] for n in names},
    }
    for i, it in enumerate(trace.iterations):
        start, width = float(it.start), float(it.end - it.start)
        for n in it.decodes:
            cells["decode"][n].append((start, width, f"{n}, iteration {i}: decode"))
        for n, size in it.prefill_chunks:
            cells["prefill"][n].append(
                (start, width, f"{n}, iteration {i}: prefill chunk of {size}")
            )
    fig = make_subplots(rows=1, cols=1)
    _cell_bars(fig, cells["prefill"], PREFILL_COLOR, "prefill chunk", 1, True)
    _cell_bars(fig, cells["decode"], DECODE_COLOR, "decode token", 1, True)
    if time_range is not None and not time_range > 0:
        raise ValueError(f"time_range must be a positive number of ticks, got {time_range!r}")
    end = time_range or (float(trace.iterations[-1].end) if trace.iterations else 1.0)
    fig.update_yaxes(categoryorder="array", categoryarray=names[::-1])
    fig.update_xaxes(title_text="simulated time (ticks)", range=[0, end * 1.02])
    fig.update_layout(
        barmode="overlay",
        title=title,
        height=220 + 50 * len(names),
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom"},
    )
    return fig


def chunked_prefill_figure(
    labels: Sequence[str],
    stream_gap_ms: Sequence[float],
    long_ttft_ms: Sequence[float],
    *,
    baseline_ms: float | None = None,
) -> go.Figure:
    """The chunked-prefill trade-off per configuration: the worst gap a running stream saw while the
    long prompt was prefilled (left, with the decode-only step time ``baseline_ms`` as a dotted
    line) and the long prompt's own time to first token (right)."""
    if not (len(labels) == len(stream_gap_ms) == len(long_ttft_ms)) or not labels:
        raise ValueError(
            "labels, stream_gap_ms and long_ttft_ms must be non-empty and of equal length"
        )
    fig = make_subplots(rows=1, cols=2, subplot_titles=("worst gap of a running stream",
                                                        "TTFT of the long prompt"))
    fig.add_trace(
        go.Bar(
            x=list(labels),
            y=list(stream_gap_ms),
            marker_color=DECODE_COLOR,
            showlegend=False,
            hovertemplate="%{x}: %{y:.1f} ms<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(
            x=list(labels),
            y=list(long_ttft_ms),
            marker_color=PREFILL_COLOR,
            showlegend=False,
            hovertemplate="%{x}: %{y:.1f} ms<extra></extra>",
        ),
        row=1,
        col=2,
    )
    if baseline_ms is not None:
        fig.add_hline(y=baseline_ms, line={"dash": "dot", "color": "#555555"}, row=1, col=1,
                      annotation_text="decode-only step", annotation_position="top right")
    fig.update_yaxes(title_text="ms", rangemode="tozero")
    fig.update_xaxes(title_text="token budget")
    fig.update_layout(
        title="Chunked prefill moves the wait from the running streams to the long prompt",
        height=420,
    )
    return fig


def batching_gain_figure(
    labels: Sequence[str], step_gain: Sequence[float], time_gain: Sequence[float]
) -> go.Figure:
    """Continuous over static batching on one workload, per model (``labels``): how many times fewer
    steps the engine took (``step_gain``, exact) and how many times less time it spent
    (``time_gain``,
    measured: the throughput gain). A dotted line marks 1 (no gain)."""
    if not (len(labels) == len(step_gain) == len(time_gain)) or not labels:
        raise ValueError("labels, step_gain and time_gain must be non-empty and of equal length")
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=list(labels),
            y=list(step_gain),
            name="fewer steps (exact)",
            marker_color=QUEUE_COLOR,
            hovertemplate="%{x}: %{y:.2f}x fewer steps<extra></extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            x=list(labels),
            y=list(time_gain),
            name="less time: the throughput gain (measured)",
            marker_color=DECODE_COLOR,
            hovertemplate="%{x}: %{y:.2f}x the throughput<extra></extra>",
        )
    )
    fig.add_hline(y=1, line={"dash": "dot", "color": "#555555"})
    fig.update_yaxes(title_text="continuous / static", rangemode="tozero")
    fig.update_layout(
        barmode="group",
        height=400,
        title="Continuous batching: the step gain, and how much of it the clock keeps",
    )
    return fig


def batch_composition_figure(ticks: Sequence[Mapping[str, int]], *, token_budget: int,
                             title: str = "") -> go.Figure:
    """Tokens in each tick's batch by kind, stacked: prompt tokens computed for the first time,
    decode tokens, and tokens computed again after a preemption by recompute; the token budget is a
    dotted line.

    ``ticks`` holds one mapping per tick with the token counts ``prefill``, ``decode`` and
    ``recomputed``.
    """
    kinds = (
        ("prefill", PREFILL_COLOR, "prompt tokens, first time"),
        ("decode", DECODE_COLOR, "decode tokens"),
        ("recomputed", RECOMPUTE_COLOR, "recomputed after a preemption"),
    )
    if not ticks or any(key not in row for row in ticks for key, _, _ in kinds):
        raise ValueError(
            "ticks must be a non-empty list of rows with 'prefill', 'decode' and 'recomputed'"
        )
    fig = go.Figure()
    for key, colour, label in kinds:
        fig.add_trace(
            go.Bar(
                x=list(range(len(ticks))),
                y=[row[key] for row in ticks],
                name=label,
                marker_color=colour,
                hovertemplate=f"tick %{{x}}: %{{y}} {key}<extra></extra>",
            )
        )
    fig.add_hline(y=token_budget, line={"dash": "dot", "color": "#555555"},
                  annotation_text="token budget", annotation_position="top right")
    fig.update_layout(barmode="stack", title=title, height=380, xaxis_title="tick",
                      yaxis_title="tokens in the batch", legend={"orientation": "h", "y": -0.25})
    return fig


def admission_limits_figure(runs: Mapping[str, Mapping[str, Sequence[int]]]) -> go.Figure:
    """One panel per binding limit, stacked: requests running and waiting after every engine step.

    ``runs[name]`` holds equal-length lists ``running`` and ``waiting`` and, optionally, ``held``
    (held at a gateway before the engine sees them) and ``limit`` (a constant line drawn on the
    running count).
    """
    if not runs:
        raise ValueError("runs must name at least one limit")
    fig = make_subplots(
        rows=len(runs), cols=1, subplot_titles=list(runs), vertical_spacing=0.35 / len(runs)
    )
    series = (("running", RUNNING_COLOR), ("waiting", WAITING_COLOR), ("held", HELD_COLOR))
    shown: set[str] = set()
    for row, (name, run) in enumerate(runs.items(), start=1):
        if "running" not in run or "waiting" not in run:
            raise ValueError(f"run {name!r} needs 'running' and 'waiting' lists")
        steps = list(range(len(run["running"])))
        for key, colour in series:
            if key in run:
                label = {"held": "held at the gateway (tenant quota)"}.get(key, key)
                fig.add_trace(
                    go.Scatter(
                        x=steps,
                        y=list(run[key]),
                        mode="lines",
                        line={"shape": "hv", "color": colour},
                        name=label,
                        legendgroup=key,
                        showlegend=key not in shown,
                    ),
                    row=row,
                    col=1,
                )
                shown.add(key)
        if "limit" in run:
            fig.add_hline(y=run["limit"], line={"dash": "dot", "color": "#555555"}, row=row, col=1)
        fig.update_yaxes(title_text="requests", rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="engine step", row=len(runs), col=1)
    plot_px = 150 * len(runs)
    _stacked_layout(fig, "Each limit alone is enough to keep requests waiting", plot_px)
    return fig


def tick_walkthrough(
    record: StepRecord,
    previous: StepRecord | None,
    *,
    max_num_batched_tokens: int,
    emitted: Mapping[str, str],
) -> Table:
    """One engine step explained in :data:`EIGHT_STEPS`, every cell filled from the engine's
    records.

    ``previous`` is the record of the step before (its finished requests are the ones reclaimed, and
    its block counts the starting point); ``emitted`` maps request id -> text streamed by this step.
    """
    if not isinstance(record, StepRecord) or (
        previous is not None and not isinstance(previous, StepRecord)
    ):
        raise TypeError("record and previous must be servelab.engine.StepRecord objects")

    def names(items) -> str:
        return ", ".join(items) or "none"

    decode, prefill = record.decode_tokens, record.prefill_tokens
    budget_used = record.num_batched_tokens
    reclaimed = previous.finished if previous is not None else {}
    preempted = [*record.preempted, *(f"{s} (swapped out)" for s in record.swapped_out)]
    rows = [
        (
            EIGHT_STEPS[0],
            f"done at the end of step {record.step - 1}: {names(reclaimed)}; "
            f"free blocks going in: {previous.blocks_free if previous else 'all'}",
        ),
        (
            EIGHT_STEPS[1],
            f"admitted {names(record.admitted)}; still waiting after the step: "
            f"{record.num_waiting}",
        ),
        (
            EIGHT_STEPS[2],
            f"{sum(decode.values())} decode + {sum(prefill.values())} prefill = {budget_used} "
            f"of {max_num_batched_tokens} tokens",
        ),
        (
            EIGHT_STEPS[3],
            f"{len(decode) + len(prefill)} sequences, {budget_used} tokens, "
            f"{record.duration * 1e3:.1f} ms",
        ),
        (
            EIGHT_STEPS[4],
            f"{len(emitted)} rows sampled: {names(emitted)}; "
            f"prefill chunks that did not reach the prompt's end sample nothing",
        ),
        (EIGHT_STEPS[5], "; ".join(f"{k}: {v!r}" for k, v in emitted.items()) or "nothing"),
        (EIGHT_STEPS[6], names(f"{k} ({v})" for k, v in record.finished.items())),
        (
            EIGHT_STEPS[7],
            f"{names(preempted)}; blocks used / free after the step: "
            f"{record.blocks_used} / {record.blocks_free}",
        ),
    ]
    return table(rows, columns=["part of the tick", f"what the engine did in step {record.step}"])
