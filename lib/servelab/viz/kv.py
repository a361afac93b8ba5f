"""Figures for the KV-cache chapter: the block pool and block tables, fragmentation, preemption,
eviction, the prefix-cache timing side channel and cache-aware routing.

Every value drawn comes from the library: pool pictures from ``BlockAllocator.inspect().snapshot()``
(taken from the engine's own allocator between steps), routing from :mod:`servelab.cluster.routing`,
and the measured numbers from engine runs the notebook makes. This module only arranges them. All
builders return a ``plotly.graph_objects.Figure``; pass it to ``servelab.viz.show``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servelab.cluster.routing import RoutingResult
from servelab.viz.core import slider_figure

__all__ = [
    "distribution_shift_figure",
    "fragmentation_figure",
    "owner_colors",
    "pool_figure",
    "pool_slider_figure",
    "preemption_figure",
    "routing_figure",
    "ttft_probe_figure",
]

PALETTE = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#1f78b4",
           "#b2df8a", "#fb9a99")
SHARED_COLOR = "#222222"
CACHED_COLOR = "#cfd8dc"
FREE_COLOR = "#ffffff"
POOL_COLUMNS = 12
POOL_KEY = "colour = holder; black = shared; grey = free, prefix reusable; white = free"


def owner_colors(seq_ids: Sequence[Hashable]) -> dict[Hashable, str]:
    """A fixed colour per sequence id, in the order given (the palette repeats after ten)."""
    seen = list(dict.fromkeys(seq_ids))
    return {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(seen)}


def _check_snapshot(snapshot: Mapping) -> None:
    for key in ("blocks", "sequences", "block_size", "num_blocks"):
        if key not in snapshot:
            raise ValueError(f"snapshot lacks {key!r}: pass BlockAllocator.inspect().snapshot()")


def _block_style(block: Mapping, colors: Mapping[Hashable, str]) -> tuple[str, str, str]:
    """(fill colour, outline colour, short label) of one physical block."""
    owners = block["owners"]
    if block["state"] == "used" and len(owners) > 1:
        return SHARED_COLOR, SHARED_COLOR, f"{block['block']}<br>x{len(owners)}"
    if block["state"] == "used":
        return colors.get(owners[0], "#888888"), "#333333", str(block["block"])
    if block["state"] == "cached":
        return CACHED_COLOR, "#78909c", str(block["block"])
    return FREE_COLOR, "#b0bec5", str(block["block"])


def _pool_trace(snapshot: Mapping, colors: Mapping[Hashable, str]) -> go.Scatter:
    xs, ys, fills, lines, labels, hovers, inks = [], [], [], [], [], [], []
    size = snapshot["block_size"]
    for block in snapshot["blocks"]:
        fill, line, label = _block_style(block, colors)
        row, col = divmod(block["block"], POOL_COLUMNS)
        xs.append(col)
        ys.append(row)
        fills.append(fill)
        lines.append(line)
        labels.append(label)
        inks.append("#ffffff" if fill == SHARED_COLOR else "#111111")
        owners = ", ".join(map(str, block["owners"])) or "none"
        hovers.append(f"block {block['block']}: {block['state']}, refcount {block['refcount']}<br>"
                      f"holders: {owners}<br>slots filled {block['num_filled']}/{size}")
    return go.Scatter(
        x=xs,
        y=ys,
        mode="markers+text",
        text=labels,
        hovertext=hovers,
        hoverinfo="text",
        textfont={"size": 10, "color": inks},
        showlegend=False,
        marker={
            "symbol": "square",
            "size": 34,
            "color": fills,
            "line": {"color": lines, "width": 2},
        },
        xaxis="x",
        yaxis="y",
    )


def _table_trace(snapshot: Mapping, colors: Mapping[Hashable, str],
                 rows: Sequence[Hashable]) -> go.Scatter:
    xs, ys, fills, labels, hovers = [], [], [], [], []
    refcount = {b["block"]: b["refcount"] for b in snapshot["blocks"]}
    for seq_id, info in snapshot["sequences"].items():
        for logical, physical in enumerate(info["block_table"]):
            xs.append(logical)
            ys.append(rows.index(seq_id))
            fills.append(SHARED_COLOR if refcount[physical] > 1 else colors.get(seq_id, "#888888"))
            labels.append(str(physical))
            hovers.append(f"{seq_id}: logical block {logical} -> physical {physical} "
                          f"(refcount {refcount[physical]})")
    return go.Scatter(
        x=xs,
        y=ys,
        mode="markers+text",
        text=labels,
        hovertext=hovers,
        hoverinfo="text",
        textfont={"size": 10, "color": "#ffffff"},
        showlegend=False,
        marker={"symbol": "square", "size": 26, "color": fills},
        xaxis="x2",
        yaxis="y2",
    )


def pool_figure(snapshot: Mapping, *, colors: Mapping[Hashable, str] | None = None,
                rows: Sequence[Hashable] | None = None, max_table_len: int | None = None,
                title: str = "") -> go.Figure:
    """The physical block pool (top) and every sequence's block table (bottom) from one snapshot.

    Top: one square per physical block, coloured by its holder; black = shared by several tables,
    grey = free but still holding a reusable prefix, white = free. Bottom: row per sequence, entry
    ``i`` is the physical block of logical block ``i``. ``rows`` fixes the order of sequence rows
    (and makes room for sequences absent from this snapshot); ``max_table_len`` fixes the bottom
    axis width.
    """
    _check_snapshot(snapshot)
    rows = list(rows) if rows is not None else list(snapshot["sequences"])
    missing = [s for s in snapshot["sequences"] if s not in rows]
    if missing:
        raise ValueError(f"rows must list every sequence of the snapshot; missing {missing}")
    colors = dict(colors) if colors is not None else owner_colors(rows)
    longest = max((len(i["block_table"]) for i in snapshot["sequences"].values()), default=1)
    width = max(max_table_len or 1, longest)
    pool_rows = -(-snapshot["num_blocks"] // POOL_COLUMNS)
    fig = go.Figure([_pool_trace(snapshot, colors), _table_trace(snapshot, colors, rows)])
    top = 0.45 + 0.1 * min(pool_rows, 4) / 4
    fig.update_layout(
        title=title,
        height=260 + 42 * (pool_rows + len(rows)),
        plot_bgcolor="#ffffff",
        margin={"l": 90, "r": 20, "t": 90, "b": 40},
        showlegend=False,
        xaxis={
            "domain": [0, 1],
            "range": [-0.7, POOL_COLUMNS - 0.3],
            "visible": False,
            "anchor": "y",
        },
        yaxis={
            "domain": [top, 1],
            "range": [pool_rows - 0.5, -0.7],
            "visible": False,
            "anchor": "x",
        },
        xaxis2={
            "domain": [0, 1],
            "range": [-0.7, max(width, POOL_COLUMNS) - 0.3],
            "anchor": "y2",
            "title": "logical block index",
            "dtick": 1,
            "showgrid": False,
            "zeroline": False,
        },
        yaxis2={
            "domain": [0, top - 0.12],
            "range": [len(rows) - 0.5, -0.5],
            "anchor": "x2",
            "tickvals": list(range(len(rows))),
            "ticktext": [str(r) for r in rows],
            "showgrid": False,
            "zeroline": False,
        },
        annotations=[
            {
                "text": f"<b>physical block pool</b><br>{POOL_KEY}",
                "x": 0,
                "y": 1.0,
                "align": "left",
                "xref": "paper",
                "yref": "paper",
                "xanchor": "left",
                "yanchor": "bottom",
                "showarrow": False,
            },
            {
                "text": "<b>block tables</b> (entry = physical block id)",
                "x": 0,
                "y": top - 0.1,
                "xref": "paper",
                "yref": "paper",
                "xanchor": "left",
                "yanchor": "bottom",
                "showarrow": False,
            },
        ],
    )
    return fig


def pool_slider_figure(
    snapshots: Sequence[Mapping],
    labels: Sequence[str],
    *,
    titles: Sequence[str] | None = None,
    label: str = "step",
    active: int = 0,
) -> go.Figure:
    """:func:`pool_figure` for each snapshot, behind one slider; colours and rows stay fixed
    throughout.

    ``active`` is the index of the snapshot shown first.
    """
    snapshots, labels = list(snapshots), list(labels)
    if not snapshots or len(snapshots) != len(labels):
        raise ValueError(
            f"need one label per snapshot, got {len(snapshots)} snapshots, {len(labels)} labels"
        )
    titles = list(titles) if titles is not None else [f"{label} {lab}" for lab in labels]
    if len(titles) != len(snapshots):
        raise ValueError("titles must have one entry per snapshot")
    for snap in snapshots:
        _check_snapshot(snap)
    rows = list(dict.fromkeys(s for snap in snapshots for s in snap["sequences"]))
    colors = owner_colors(rows)
    widest = max(len(i["block_table"]) for snap in snapshots for i in snap["sequences"].values()) \
        if rows else 1
    by_label = dict(zip(labels, zip(snapshots, titles)))
    return slider_figure(
        lambda lab: pool_figure(by_label[lab][0], colors=colors, rows=rows, max_table_len=widest,
                                title=by_label[lab][1]),
        labels, label=label, active=active)


def fragmentation_figure(block_sizes: Sequence[int], measured: Sequence[float],
                         predicted: Sequence[float]) -> go.Figure:
    """Internal fragmentation (share of allocated KV slots holding no token) against block size.

    ``measured`` comes from the engine's allocator during a run; ``predicted`` from
    ``servelab.kv.block_alloc_slots`` on the same sequence lengths.
    """
    if not (len(block_sizes) == len(measured) == len(predicted)) or not block_sizes:
        raise ValueError(
            "block_sizes, measured and predicted must be non-empty and of equal length"
        )
    fig = go.Figure([
        go.Scatter(x=list(block_sizes), y=[100 * v for v in measured], mode="lines+markers",
                   name="measured on the engine (mean over steps)"),
        go.Scatter(x=list(block_sizes), y=[100 * v for v in predicted], mode="lines+markers",
                   name="block_alloc_slots on the final lengths", line={"dash": "dot"}),
    ])
    fig.update_layout(
        title="Internal fragmentation grows with the block size",
        xaxis={"title": "block size (tokens)", "type": "log", "tickvals": list(block_sizes)},
        yaxis={"title": "allocated slots holding no token (%)", "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.25},
        height=420,
    )
    return fig


def preemption_figure(rows: Sequence[Mapping[str, float]], metrics: Mapping[str, str]) -> go.Figure:
    """One small bar chart per metric, one bar per preemption mode.

    ``rows`` are dicts with a ``"mode"`` key plus one key per entry of ``metrics`` (key -> axis
    title).
    """
    if not rows or not metrics:
        raise ValueError("rows and metrics must be non-empty")
    missing = [k for k in ("mode", *metrics) if any(k not in r for r in rows)]
    if missing:
        raise ValueError(f"rows lack keys {sorted(set(missing))}")
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=list(metrics.values()),
                        horizontal_spacing=0.12)
    modes = [r["mode"] for r in rows]
    colors = owner_colors(modes)
    for col, key in enumerate(metrics, start=1):
        fig.add_trace(
            go.Bar(
                x=modes,
                y=[r[key] for r in rows],
                marker_color=[colors[m] for m in modes],
                showlegend=False,
                hovertemplate="%{x}: %{y}<extra></extra>",
            ),
            row=1,
            col=col,
        )
    fig.update_layout(title="What each way of preempting frees, and what it costs", height=380)
    return fig


def distribution_shift_figure(
    tokens: Sequence[str],
    full: Sequence[float],
    evicted: Sequence[float],
    *,
    dropped: int,
    distance: float,
    y_max: float | None = None,
) -> go.Figure:
    """Next-token probabilities with the whole history cached vs with the oldest ``dropped`` tokens'
    KV evicted, for the same candidate ``tokens``; ``distance`` (total variation) goes in the title.

    ``y_max`` fixes the probability axis (pass the largest value over every frame of a slider).
    """
    if not (len(tokens) == len(full) == len(evicted)) or not tokens:
        raise ValueError("tokens, full and evicted must be non-empty and of equal length")
    if y_max is not None and not 0 < y_max <= 1:
        raise ValueError(f"y_max must be in (0, 1], got {y_max!r}")
    top = y_max if y_max is not None else min(1.0, 1.1 * max(*full, *evicted))
    labels = [repr(t) for t in tokens]
    fig = go.Figure([
        go.Bar(x=labels, y=list(full), name="full KV history", marker_color=PALETTE[0]),
        go.Bar(x=labels, y=list(evicted), name=f"oldest {dropped} tokens' KV evicted",
               marker_color=PALETTE[1]),
    ])
    fig.update_layout(
        barmode="group",
        height=440,
        yaxis={"title": "probability", "range": [0, top]},
        title=f"{dropped} oldest tokens evicted: total variation {distance:.4f}",
        margin={"t": 110},
        legend={"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
    )
    return fig


def ttft_probe_figure(samples: Mapping[str, Sequence[float]], *, unit: str = "ms") -> go.Figure:
    """Time to first token of probe requests, one box (with every point) per condition."""
    if not samples or any(len(v) == 0 for v in samples.values()):
        raise ValueError("samples must map each condition to at least one measurement")
    colors = owner_colors(list(samples))
    fig = go.Figure(
        [
            go.Box(
                y=list(v),
                name=name,
                boxpoints="all",
                jitter=0.4,
                pointpos=0,
                marker_color=colors[name],
                showlegend=False,
            )
            for name, v in samples.items()
        ]
    )
    fig.update_layout(
        title="What a probing tenant measures",
        yaxis={"title": f"TTFT ({unit})", "rangemode": "tozero"},
        height=420,
    )
    return fig


def routing_figure(results: Sequence[RoutingResult]) -> go.Figure:
    """Prefix-cache hit rate (left) and completion time, mean and p95 on a log axis (right), per
    policy."""
    if not results or not all(isinstance(r, RoutingResult) for r in results):
        raise ValueError("results must be a non-empty sequence of RoutingResult")
    names = [r.policy for r in results]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("prefix-cache hit rate",
                                                        "completion time (simulated ms, log)"))
    fig.add_trace(
        go.Bar(
            x=names,
            y=[r.hit_rate for r in results],
            marker_color=PALETTE[2],
            showlegend=False,
            hovertemplate="%{x}: %{y:.1%}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(go.Bar(x=names, y=[r.mean_completion_ms for r in results], name="mean",
                         marker_color=PALETTE[0]), row=1, col=2)
    fig.add_trace(go.Bar(x=names, y=[r.completion_percentile_ms(95) for r in results], name="p95",
                         marker_color=PALETTE[1]), row=1, col=2)
    fig.update_yaxes(tickformat=".0%", range=[0, 1], row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=2)  # a queue that runs away dwarfs the others otherwise
    fig.update_layout(barmode="group", height=420, legend={"orientation": "h", "y": -0.2},
                      title="The highest hit rate is not the shortest completion time")
    return fig
