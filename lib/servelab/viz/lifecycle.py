"""The request state machine, drawn from :mod:`servelab.lifecycle.state_machine` and never by hand.

:func:`layout` places the states of ``TRANSITIONS`` by rule: the happy path's non-terminal states
(:data:`HAPPY_PATH`, checked against ``TRANSITIONS``) form the main row; every other non-terminal
state (a side branch) sits above it at the mean position of the main-row states it connects to;
terminal states sit below, under the states that lead to them, pushed apart where they would
overlap. :func:`state_diagram` draws that layout with plotly (hover a state for its guard, resources
and cleanup); :func:`journey_figure` steps through one request's history on the same diagram;
:func:`state_table` renders ``STATE_TABLE`` as a table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import plotly.graph_objects as go

from servelab.lifecycle.state_machine import STATE_TABLE, TRANSITIONS, RequestState, StateInfo
from servelab.lifecycle.reservation_rules import default_policy, default_rule
from servelab.viz import core

__all__ = ["ADMISSION_STATES", "HAPPY_PATH", "Point", "check_path", "journey_figure", "layout",
           "state_diagram", "state_guard", "state_table"]

MIN_GAP = 1.0
"""Smallest horizontal distance between two states of one row."""
ROW_Y = {"side": 1.0, "main": 0.0, "terminal": -1.0}
COLORS = {"main": "#2c7fb8", "side": "#fdae61", "terminal": "#969696", "current": "#d7191c"}
EDGE_STYLE = {  # (width, colour) by the kind of edge
    "main": (2.5, "#2c7fb8"),
    "side": (1.3, "#e08214"),
    "terminal": (0.7, "#bdbdbd"),
}

Transitions = Mapping[RequestState, frozenset[RequestState]]


@dataclass(frozen=True)
class Point:
    """Where a state is drawn and which row it belongs to."""

    x: float
    y: float
    row: str


def _states(transitions: Transitions) -> list[RequestState]:
    """The states in definition order, each once (enum aliases such as RUNNABLE are skipped)."""
    return list(dict.fromkeys(transitions))


HAPPY_PATH = (RequestState.ARRIVED, RequestState.VALIDATED, RequestState.QUEUED,
              RequestState.PREFILL, RequestState.DECODE, RequestState.FINISHED)
"""A request that completes normally: gate and tokenize, admit with a reservation, wait, prefill
(the first token comes from its last pass), decode, finish (and be reclaimed)."""


def check_path(path: Sequence[RequestState], transitions: Transitions = TRANSITIONS) -> None:
    """Raise ValueError unless every consecutive pair of ``path`` is an allowed transition."""
    if len(path) < 2:
        raise ValueError(f"a path needs at least two states, got {list(path)}")
    for a, b in zip(path, path[1:]):
        if b not in transitions.get(a, ()):
            raise ValueError(f"{a.name} -> {b.name} is not an allowed transition")


def _spread(xs: dict[RequestState, float], order: list[RequestState]) -> dict[RequestState, float]:
    """Push states of one row apart to at least MIN_GAP, keeping their order and mean position."""
    ranked = sorted(xs, key=lambda s: (xs[s], order.index(s)))
    placed: list[float] = []
    for state in ranked:
        placed.append(max(xs[state], placed[-1] + MIN_GAP) if placed else xs[state])
    shift = (sum(xs.values()) - sum(placed)) / len(placed)
    return {s: x + shift for s, x in zip(ranked, placed)}


def layout(transitions: Transitions = TRANSITIONS,
           table: Mapping[RequestState, StateInfo] = STATE_TABLE,
           path: Sequence[RequestState] = HAPPY_PATH) -> dict[RequestState, Point]:
    """A position for every state, computed from the transitions (see the module docstring)."""
    order = _states(transitions)
    missing = [s for s in order if s not in table]
    if missing:
        raise ValueError(f"states without a STATE_TABLE row: {missing}")
    check_path(path, transitions)
    chain = [s for s in path if not table[s].terminal]
    x = {s: float(i) for i, s in enumerate(chain)}
    neighbours = {s: set(transitions[s]) | {p for p in order if s in transitions[p]}
                  for s in order}

    def barycentre(state: RequestState) -> float:
        known = [x[n] for n in neighbours[state] if n in x]
        return sum(known) / len(known) if known else 0.0

    side = [s for s in order if s not in x and not table[s].terminal]
    x.update(_spread({s: barycentre(s) for s in side}, order) if side else {})
    terminal = [s for s in order if table[s].terminal]
    x.update(_spread({s: barycentre(s) for s in terminal}, order) if terminal else {})
    row = {s: "main" if s in chain else "terminal" if table[s].terminal else "side" for s in order}
    return {s: Point(x[s], ROW_Y[row[s]], row[s]) for s in order}


def _label(state: RequestState) -> str:
    return state.name.replace("_", " ")


ADMISSION_STATES = (RequestState.QUEUED,)
"""States entered by passing admission: their guard names the reservation rule."""


def _guard(state: RequestState, info: StateInfo) -> str:
    if state not in ADMISSION_STATES:
        return info.guard
    return f'{info.guard} (the default "{default_policy()}" rule reserves {default_rule()})'


def state_guard(state: RequestState, table: Mapping[RequestState, StateInfo] = STATE_TABLE) -> str:
    """The guard of ``state`` as the book shows it; an admission state's names what its reservation
    covers, in the words of :mod:`servelab.lifecycle.reservation_rules` for the default
    ``EngineConfig``."""
    return _guard(state, table[state])


def _hover(state: RequestState, info: StateInfo) -> str:
    holds = ", ".join(r.name.lower() for r in info.holds) or "nothing"
    return (f"<b>{state.name}</b><br>{info.summary}<br><i>guard:</i> {_guard(state, info)}"
            f"<br><i>holds:</i> {holds}<br><i>cleanup:</i> {info.cleanup}")


def _edge_kind(src: RequestState, dst: RequestState, points: Mapping[RequestState, Point]) -> str:
    """``main`` for a step of the happy path, ``terminal`` for any other way to end, else
    ``side``."""
    if (src, dst) in zip(HAPPY_PATH, HAPPY_PATH[1:]):
        return "main"
    return "terminal" if points[dst].row == "terminal" else "side"


def _wrap(text: str, width: int = 60) -> str:
    """Break hover text into lines of about ``width`` characters (plotly does not wrap)."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + len(word) > width and not line.endswith(">"):
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "<br>".join([*lines, line])


def state_diagram(highlight: RequestState | None = None, *, title: str | None = None,
                  transitions: Transitions = TRANSITIONS,
                  table: Mapping[RequestState, StateInfo] = STATE_TABLE) -> go.Figure:
    """The state machine as a plotly figure: states as markers, allowed transitions as arrows.

    Main-row states are blue, side branches orange, terminal states grey; ``highlight`` paints one
    state red. Hovering a state shows its summary, guard, resources held and cleanup.
    """
    if highlight is not None and highlight not in transitions:
        raise ValueError(f"highlight must be a state of the transition table, got {highlight!r}")
    points = layout(transitions, table)
    fig = go.Figure()
    for src in points:
        for dst in sorted(transitions[src], key=list(points).index):
            a, b = points[src], points[dst]
            width, color = EDGE_STYLE[_edge_kind(src, dst, points)]
            fig.add_annotation(x=b.x, y=b.y, ax=a.x, ay=a.y, xref="x", yref="y", axref="x",
                               ayref="y", showarrow=True, arrowhead=2, arrowsize=1,
                               arrowwidth=width, arrowcolor=color, standoff=14, startstandoff=14,
                               text="")
    states = list(points)
    colors = [COLORS["current"] if s == highlight else COLORS[points[s].row] for s in states]
    fig.add_trace(go.Scatter(
        x=[points[s].x for s in states], y=[points[s].y for s in states], mode="markers+text",
        marker={"size": 26, "color": colors, "line": {"width": 1, "color": "white"}},
        text=[_label(s) for s in states],
        textposition=["top center" if points[s].row != "terminal" else "bottom center"
                      for s in states],
        hovertext=[_wrap(_hover(s, table[s])) for s in states], hoverinfo="text",
        showlegend=False,
    ))
    xs = [p.x for p in points.values()]
    fig.update_layout(
        title={"text": title or "Request states and allowed transitions"},
        xaxis={"visible": False, "range": [min(xs) - 0.8, max(xs) + 0.8]},
        yaxis={"visible": False, "range": [-1.6, 1.6]},
        height=430, margin={"l": 10, "r": 10, "t": 60, "b": 10}, plot_bgcolor="white",
    )
    return fig


def journey_figure(history: Sequence[tuple[RequestState, float]], *,
                   time_unit: str = "ms", scale: float = 1e3) -> go.Figure:
    """Step through one request's ``(state, entered_at)`` history on the state diagram.

    The slider moves along the history; each frame highlights the current state and its title says
    how long the request stayed there (until the next entry; the last state is final).
    ``scale`` converts the history's seconds into ``time_unit``.
    """
    steps = list(history)
    if not steps:
        raise ValueError("history must not be empty")
    for (_, t0), (_, t1) in zip(steps, steps[1:]):
        if t1 < t0:
            raise ValueError(f"history times must not decrease, got {t0} then {t1}")

    def frame(i: int) -> go.Figure:
        state, entered = steps[i]
        if i + 1 < len(steps):
            stay = f"stayed {(steps[i + 1][1] - entered) * scale:.3g} {time_unit}"
        else:
            stay = "final"
        at = (entered - steps[0][1]) * scale
        return state_diagram(state, title=f"step {i + 1}/{len(steps)}: {state.name} at "
                                          f"{at:.3g} {time_unit}, {stay}")

    return core.slider_figure(frame, list(range(len(steps))), label="step",
                              value_text=lambda i: str(i + 1))


def _value(value: object) -> str:
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, tuple):
        return ", ".join(_value(v) for v in value) or "-"
    return str(value)


def state_table(table: Mapping[RequestState, StateInfo] = STATE_TABLE) -> core.Table:
    """``STATE_TABLE`` as a table: per state, its guard, what it holds, its cleanup, terminal or
    not."""
    rows = [
        {"state": state.name, "guard (to enter)": _guard(state, info), "holds": _value(info.holds),
         "cleanup (on a terminal exit)": info.cleanup, "terminal": "yes" if info.terminal else ""}
        for state, info in table.items()
    ]
    return core.table(rows, caption="The request state table, rendered from "
                                    "servelab.lifecycle.STATE_TABLE")
