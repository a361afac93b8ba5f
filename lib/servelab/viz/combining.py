"""Figures and the troubleshooting table of the chapter on combining optimizations (§7).

What is drawn comes from the library: distributions from :mod:`servelab.optimizations.speculative`,
per-cycle records from :func:`servelab.optimizations.speculative.speculative_generate`, the
speculative arithmetic from :mod:`servelab.metrics.capacity`, and the timings the chapter notebook
measures. This module only arranges them; every builder returns a ``plotly.graph_objects.Figure``
(pass it to ``servelab.viz.show``).

:data:`TROUBLESHOOTING` is the chapter's "production symptom -> where to look -> what to measure"
table, kept as data so that the page renders it and a test can check it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from servelab.metrics.capacity import expected_tokens_per_cycle, speculative_time_per_token
from servelab.optimizations.speculative import CycleRecord
from servelab.viz.core import Table, table

__all__ = [
    "TROUBLESHOOTING",
    "Diagnosis",
    "bookkeeping_figure",
    "combination_figure",
    "marginal_figure",
    "speculative_cost_figure",
    "troubleshooting_table",
]

TARGET_COLOR, DRAFT_COLOR, SPEC_COLOR, EMPIRICAL_COLOR = "#1b9e77", "#d95f02", "#7570b3", "#e7298a"
ACCEPT_COLOR, TARGET_TOKEN_COLOR, ROLLBACK_COLOR = "#1b9e77", "#7570b3", "#bdbdbd"


# --------------------------------------------------------------------------------------------------
# Speculative decoding
# --------------------------------------------------------------------------------------------------


def marginal_figure(p: np.ndarray, q: np.ndarray, exact: np.ndarray, labels: Sequence[str],
                    empirical: np.ndarray | None = None, show_top: int = 10) -> go.Figure:
    """Grouped bars over the ``show_top`` most likely target tokens: target ``p``, draft ``q``, the
    exact accept/correct marginal and (optionally) the empirical frequency of a simulation."""
    p, q, exact = (np.asarray(v, dtype=float) for v in (p, q, exact))
    if not p.shape == q.shape == exact.shape or len(labels) != p.size:
        raise ValueError(
            f"p, q, exact and labels must have one entry per token, got {p.shape}, {q.shape}, "
            f"{exact.shape} and {len(labels)} labels"
        )
    if show_top < 1:
        raise ValueError(f"show_top must be >= 1, got {show_top}")
    top = np.argsort(-np.maximum(p, q), kind="stable")[:show_top]
    names = [repr(labels[i])[1:-1] or "(empty)" for i in top]
    series = [("target p", p, TARGET_COLOR), ("draft q", q, DRAFT_COLOR),
              ("accept/correct, exact", exact, SPEC_COLOR)]
    if empirical is not None:
        empirical = np.asarray(empirical, dtype=float)
        if empirical.shape != p.shape:
            raise ValueError(f"empirical must have shape {p.shape}, got {empirical.shape}")
        series.append(("accept/correct, simulated", empirical, EMPIRICAL_COLOR))
    fig = go.Figure([go.Bar(name=name, x=names, y=values[top], marker_color=color,
                            hovertemplate="%{x}: %{y:.4f}<extra>" + name + "</extra>")
                     for name, values, color in series])
    fig.update_layout(
        barmode="group",
        height=420,
        yaxis_title="probability",
        xaxis_title="token (most likely under target or draft)",
        title="Speculative sampling emits the target's distribution, whatever the draft proposes",
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def speculative_cost_figure(
    acceptance_rate: float = 0.7,
    draft_ms_per_token: float = 4.0,
    verify_ms: float = 24.0,
    baseline_ms: float = 20.0,
    max_k: int = 8,
) -> go.Figure:
    """Milliseconds per emitted token against draft length ``k`` (1..``max_k``), from the capacity
    model.

    One cycle costs ``k * draft_ms_per_token + verify_ms`` and advances the expected ``(1 - a^(k+1))
    / (1 - a)`` tokens (``servelab.metrics.capacity``: i.i.d. acceptance ``a``); the dashed line is
    plain decoding at ``baseline_ms`` per token. Below the line speculation pays.
    """
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    ks = list(range(1, max_k + 1))
    ms = [speculative_time_per_token(k * draft_ms_per_token, verify_ms,
                                     expected_tokens_per_cycle(acceptance_rate, k)) for k in ks]
    best = int(np.argmin(ms))
    fig = go.Figure([
        go.Scatter(x=ks, y=ms, mode="lines+markers", name="speculative", line={"color": SPEC_COLOR},
                   hovertemplate="k=%{x}: %{y:.1f} ms/token<extra></extra>"),
        go.Scatter(x=[1, max_k], y=[baseline_ms, baseline_ms], mode="lines", name="plain decoding",
                   line={"color": TARGET_COLOR, "dash": "dash"}, hoverinfo="skip"),
    ])
    verdict = "faster" if ms[best] < baseline_ms else "slower"
    fig.update_layout(
        height=400,
        xaxis_title="draft length k (tokens proposed per cycle)",
        yaxis_title="ms per emitted token",
        yaxis_range=[0, max(2.5 * baseline_ms, verify_ms + draft_ms_per_token) * 1.05],
        title=(
            f"acceptance {acceptance_rate:.2f}: best k={ks[best]} at {ms[best]:.1f} ms/token "
            f"({baseline_ms / ms[best]:.2f}x, {verdict})"
        ),
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def bookkeeping_figure(cycles: Sequence[CycleRecord], max_cycles: int = 30) -> go.Figure:
    """Per verify pass: accepted drafts, the target's own token, and rolled-back K/V entries
    (stacked).

    The first two together are the emitted tokens; all three are the K/V entries the pass wrote for
    drafted positions (catch-up entries for the previous cycle's last token are left out).
    """
    if not cycles:
        raise ValueError("cycles must not be empty")
    shown = list(cycles)[:max_cycles]
    x = list(range(1, len(shown) + 1))
    target_tokens = [c.emitted - min(c.accepted, c.emitted) for c in shown]
    stacks = [
        (
            "accepted drafts (emitted, KV committed)",
            [min(c.accepted, c.emitted) for c in shown],
            ACCEPT_COLOR,
        ),
        ("correction or bonus token (emitted)", target_tokens, TARGET_TOKEN_COLOR),
        (
            "rejected drafts (KV rolled back)",
            [c.target_kv_rolled_back for c in shown],
            ROLLBACK_COLOR,
        ),
    ]
    fig = go.Figure([go.Bar(name=name, x=x, y=values, marker_color=color,
                            hovertemplate="cycle %{x}: %{y}<extra>" + name + "</extra>")
                     for name, values, color in stacks])
    emitted = sum(c.emitted for c in cycles)
    verified = sum(c.verified for c in cycles)
    rolled = sum(c.target_kv_rolled_back for c in cycles)
    fig.update_layout(
        barmode="stack",
        height=400,
        xaxis_title="target verify pass",
        yaxis_title="tokens",
        title=(
            f"{len(cycles)} verify passes: {verified} drafts verified, {emitted} tokens "
            f"emitted, {rolled} KV entries rolled back"
        ),
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


# --------------------------------------------------------------------------------------------------
# Combining two optimizations
# --------------------------------------------------------------------------------------------------


def combination_figure(ms_per_token: Mapping[str, float], baseline: str, alone: Sequence[str],
                       together: str) -> go.Figure:
    """Measured speed-ups over ``baseline``: each optimization ``alone``, both ``together``, and the
    product of the separate speed-ups (what "they multiply" would predict)."""
    missing = [name for name in (baseline, *alone, together) if name not in ms_per_token]
    if missing:
        raise ValueError(f"ms_per_token lacks {missing}")
    if len(alone) != 2:
        raise ValueError(f"alone must name exactly two configurations, got {list(alone)}")
    speedup = {name: ms_per_token[baseline] / ms_per_token[name] for name in (*alone, together)}
    product = speedup[alone[0]] * speedup[alone[1]]
    names = [*alone, together, "product of the two alone"]
    values = [speedup[alone[0]], speedup[alone[1]], speedup[together], product]
    colors = [DRAFT_COLOR, SPEC_COLOR, TARGET_COLOR, ROLLBACK_COLOR]
    fig = go.Figure(
        go.Bar(
            x=names,
            y=values,
            marker_color=colors,
            text=[f"{v:.2f}x" for v in values],
            textposition="outside",
            hovertemplate="%{x}: %{y:.3f}x<extra></extra>",
        )
    )
    fig.add_hline(y=1.0, line_dash="dash", line_color="#555555")
    fig.update_layout(
        height=400,
        yaxis_title=f"speed-up over {baseline}",
        yaxis_range=[0, max(values) * 1.25],
        title=f"Measured together: {speedup[together]:.2f}x; multiplied: {product:.2f}x",
    )
    return fig


# --------------------------------------------------------------------------------------------------
# Troubleshooting
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Diagnosis:
    """One row of the troubleshooting table: what production shows, where in the request state
    machine to look, what to measure to confirm it, and the section that explains it."""

    symptom: str
    where: str
    measure: str
    section: str


TROUBLESHOOTING: tuple[Diagnosis, ...] = (
    Diagnosis(
        "TTFT high, TPOT normal",
        "queued/runnable wait after admission; prefill of the miss range; prefix lookup",
        "queue wait vs prefill time per request; miss length (prompt minus prefix hit); "
        "prefill chunk sizes",
        "§1, §4, §5",
    ),
    Diagnosis(
        "p99 ITL spikes while mean TPOT looks fine",
        "decode ticks that share the batch with long prefill chunks or very long contexts",
        "per-tick token budget split (prefill vs decode tokens); context length of "
        "co-batched requests; "
        "ITL percentiles with sample size",
        "§2, §5",
    ),
    Diagnosis(
        "KV out-of-memory, frequent preemption",
        "admission + KV reservation; PREEMPTED/SWAPPED branches",
        "reserved vs allocated vs logical slots; predicted vs actual output length; "
        "preemptions by kind "
        "(recompute, swap, deschedule: only the first two free memory)",
        "§1, §4, §5",
    ),
    Diagnosis(
        "throughput up, users complain (goodput down)",
        "scheduler batch size and policy; load point past the knee",
        "throughput-latency sweep; SLO attainment and goodput per load point; open-loop load",
        "§2, §5",
    ),
    Diagnosis(
        "server memory grows with slow clients",
        "streaming/detokenize stage; BACKPRESSURED state",
        "unsent tokens buffered per request; time spent backpressured; buffer cap hits",
        "§1, §3",
    ),
    Diagnosis(
        "GPU busy on requests nobody reads",
        "cancellation path to CANCELLED and reclaim",
        "time from client disconnect to KV release; decode steps run after cancellation",
        "§1",
    ),
    Diagnosis(
        "free blocks slowly leak, or a block is freed twice",
        "the shared reclaim routine of the four terminal states",
        "free blocks + sum of refcounts vs pool size; terminal records per request (must "
        "be exactly 1)",
        "§0, §1",
    ),
    Diagnosis(
        "prefix-cache hit rate high, end-to-end latency barely better",
        "prefix lookup saves prefill only; routing to a hot replica",
        "prefill tokens saved vs decode time; queue depth of the replica that holds the prefix",
        "§4, §6",
    ),
    Diagnosis(
        "same seed, different tokens across runs",
        "batch composition, kernel path, parallel topology, shared RNG",
        "rerun with fixed batch, topology, kernels, precision and a per-request RNG; "
        "still different means a real bug",
        "§1",
    ),
    Diagnosis(
        "speculative decoding on, latency worse",
        "draft + verify + commit/rollback inside one tick",
        "acceptance rate; tokens per verify pass; draft ms + verify ms per cycle vs plain "
        "ms/token; batch size",
        "§7",
    ),
    Diagnosis(
        "quality or acceptance dropped after quantizing",
        "weights (and draft) quantization; KV cache format",
        "held-out loss fp vs quantized; draft acceptance rate before and after; KV format "
        "per layer",
        "§7",
    ),
    Diagnosis(
        "billed tokens differ from tokens the client saw",
        "generated vs emitted vs committed counters",
        "the three counters per request: stop-string truncation and rejected drafts separate them",
        "§1, §7",
    ),
    Diagnosis(
        "first requests after a deploy are very slow",
        "cold start: weight load, kernel selection, graph capture, pool set-up",
        "cold-start latencies reported apart from the steady-state distribution",
        "§1, §2",
    ),
    Diagnosis(
        "disaggregated prefill/decode slower than co-located",
        "KV transfer between pools; pool sizing after prefix hits shrink prefill work",
        "KV transfer time per request vs interference saved; utilisation of each pool; "
        "prefix hit rate",
        "§6, §7",
    ),
)
"""The rebuilt "production symptom -> diagnostic path" table (sections refer to the course
chapters)."""


def troubleshooting_table(rows: Sequence[Diagnosis] = TROUBLESHOOTING) -> Table:
    """The troubleshooting rows as a :class:`~servelab.viz.core.Table`."""
    return table([{"production symptom": r.symptom, "where to look in the state machine": r.where,
                   "what to measure": r.measure, "see": r.section} for r in rows])
