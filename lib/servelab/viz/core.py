"""Display helpers every chapter shares: one call that works in three places.

A figure or table made in a notebook has three audiences:

* the **static HTML book**: there is no kernel and no network. A figure must be drawn by the copy of
  plotly.js the book ships in its own ``_static`` folder; a slider must move between frames that
  were computed when the book was built;
* **Jupyter / JupyterLab / VS Code**: they render plotly's own mime type natively;
* **Colab**: it shows ``text/html`` in a sandboxed frame that has no plotly.js, so the HTML loads it
  from the plotly CDN when (and only when) ``window.Plotly`` is missing.

:func:`show` emits all three in one output; :func:`slider_figure` precomputes the frames of a one-
parameter sweep; :func:`table` turns computed rows into an HTML table; :func:`live_controls` gives a
live ipywidgets control in a kernel whose static twin (a :func:`slider_figure`) is what the book
shows; :func:`publish` stores a value or an output under a name so that a narrative page can paste
it with myst-nb's ``{glue}`` role and directive.
"""

from __future__ import annotations

import hashlib
import html
import inspect
import itertools
import json
import numbers
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.utils import PlotlyJSONEncoder

from servelab.prose import yes_no
from servelab.viz.ticks import label_log_axes

__all__ = [
    "FigureOutput",
    "LiveControls",
    "Table",
    "figure_html",
    "in_book_build",
    "live_controls",
    "publish",
    "published_value",
    "show",
    "slider_figure",
    "table",
]

PLOTLY_CDN = "https://cdn.plot.ly/plotly-{version}.min.js"
"""Where Colab (which has no plotly.js of its own) fetches plotly.js; never used by the book."""

FRAME_LAYOUT_KEYS = ("title", "annotations", "shapes")
"""Layout parts a :func:`slider_figure` frame may change (axes stay fixed across frames)."""

BOOK_BUILD_ENV = "SERVELAB_BOOK_BUILD"
"""Set to ``1`` by the book's Sphinx extension; the kernels it starts inherit it."""

_figure_counter = itertools.count()


def in_book_build() -> bool:
    """True while the static book is being built (outputs then carry only what the HTML needs)."""
    return os.environ.get(BOOK_BUILD_ENV) == "1"


# --------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------


def _plotlyjs_version() -> str:
    from plotly.offline import get_plotlyjs_version

    return get_plotlyjs_version()


def _check_figure(fig: Any) -> go.Figure:
    if not isinstance(fig, go.Figure):
        raise TypeError(f"expected a plotly.graph_objects.Figure, got {type(fig).__name__}")
    return fig


def _div_id(spec_json: str) -> str:
    """A page-unique, run-to-run stable element id: the figure's content hash plus a counter."""
    digest = hashlib.sha1(f"{next(_figure_counter)}:{spec_json}".encode()).hexdigest()
    return f"servelab-fig-{digest[:12]}"


UNTITLED_TOP_MARGIN_PX = 40
"""Top margin of a figure without a title (plotly's default of 100 px leaves a blank band)."""


def figure_html(fig: go.Figure, *, height: int | None = None) -> str:
    """The ``<div>`` + ``<script>`` that draws ``fig`` with whatever plotly.js the page has.

    The snippet never embeds plotly.js: the book loads one shared copy from ``_static`` before any
    figure, and in a frame without ``window.Plotly`` (Colab) it fetches the matching version from
    the plotly CDN first. Frames (for sliders) are added after the first draw.
    """
    _check_figure(fig)
    if height is not None and height <= 0:
        raise ValueError(f"height must be positive, got {height}")
    spec = label_log_axes(json.loads(pio.to_json(fig, validate=True)))
    spec["config"] = {"responsive": True, "displaylogo": False}
    layout = spec.setdefault("layout", {})
    if not (layout.get("title") or {}).get("text") and "t" not in (layout.get("margin") or {}):
        # no blank band above the plot
        layout.setdefault("margin", {})["t"] = UNTITLED_TOP_MARGIN_PX
    spec_json = json.dumps(spec, separators=(",", ":"), sort_keys=True)
    div_id = _div_id(spec_json)
    px = height or fig.layout.height or 450
    cdn = PLOTLY_CDN.format(version=_plotlyjs_version())
    # "</" inside a JSON string would close the <script> element early.
    safe_json = spec_json.replace("</", "<\\/")
    return (
        f'<div id="{div_id}" class="servelab-figure" style="width:100%;height:{px}px;"></div>\n'
        "<script>\n(function () {\n"
        f"  var spec = {safe_json};\n"
        "  function draw() {\n"
        f'    var el = document.getElementById("{div_id}");\n'
        "    if (!el) { return; }\n"
        "    Plotly.newPlot(el, spec.data, spec.layout || {}, spec.config).then(function () {\n"
        "      if (spec.frames) { return Plotly.addFrames(el, spec.frames); }\n"
        "    });\n"
        "  }\n"
        "  function start() {\n"
        "    if (window.Plotly) { draw(); return; }\n"
        '    var s = document.createElement("script");\n'
        f'    s.src = "{cdn}";\n'
        "    s.onload = draw;\n"
        "    document.head.appendChild(s);\n"
        "  }\n"
        "  // Draw once the page is laid out, so the figure takes its container's final width.\n"
        '  if (document.readyState === "loading") {\n'
        '    document.addEventListener("DOMContentLoaded", start);\n'
        "  } else { start(); }\n"
        "})();\n</script>"
    )


class FigureOutput:
    """A plotly figure as a notebook output: ``text/html`` for the book and Colab, plotly's own
    mime type for Jupyter front ends that render it natively, and a one-line text fallback."""

    def __init__(self, fig: go.Figure, *, height: int | None = None) -> None:
        self.fig = _check_figure(fig)
        self.height = height

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, Any]:
        title = self.fig.layout.title.text or "untitled"
        bundle = {
            "text/html": figure_html(self.fig, height=self.height),
            "text/plain": f"<plotly figure: {title}>",
        }
        if not in_book_build():  # the book's renderer knows no plotly mime type and would warn
            bundle["application/vnd.plotly.v1+json"] = json.loads(pio.to_json(self.fig))
        return bundle


def _displayable(obj: Any) -> Any:
    return FigureOutput(obj) if isinstance(obj, go.Figure) else obj


def show(obj: Any, *, name: str | None = None) -> None:
    """Display a plotly figure (or a :class:`Table`, or anything IPython can display).

    With ``name``, the output is also stored for a narrative page, which pastes it with
    ``{glue}`` (see :func:`publish`).
    """
    if name is None:
        from IPython.display import display

        display(_displayable(obj))
    else:
        publish(name, obj, display=True)


PUBLISHED_DIGITS = 12


def published_value(value: Any) -> Any:
    """``value`` as :func:`publish` stores it: floats (numpy's too, also inside lists, tuples and
    dicts) rounded to :data:`PUBLISHED_DIGITS` significant digits, numpy integers as ``int``.

    Two CPUs with different SIMD paths (AVX2, AVX-512) may disagree in a float's last bits; rounding
    keeps those bits out of what a page pastes and nbval compares. A value whose computation depends
    on float reduction order (a torch matmul, a sum over threads) differs further, in its 6th or 7th
    digit: its cell rounds it to the precision its claim needs before publishing it.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(f"{float(value):.{PUBLISHED_DIGITS}g}")
    if isinstance(value, (list, tuple)):
        return type(value)(published_value(v) for v in value)
    if isinstance(value, dict):
        return {k: published_value(v) for k, v in value.items()}
    return value


def publish(name: str, value: Any, *, display: bool = False) -> None:
    """Store ``value`` (a number, a string, a figure, a table) under ``name`` for a narrative page.

    A page pastes it with ``{glue:text}`../notebooks/NB.ipynb::name:.2f``` (numbers and text) or the
    ``{glue}`` directive (figures and tables). Outside a book build (myst-nb missing, e.g. Colab)
    this only displays the value when ``display`` is true.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be a Python identifier, got {name!r}")
    value = _displayable(published_value(value))
    try:
        from myst_nb import glue
    except ImportError:
        if display:
            from IPython.display import display as ipy_display

            ipy_display(value)
        return
    glue(name, value, display=display)


def _layout_json(fig: go.Figure, key: str) -> str:
    return json.dumps(fig.layout.to_plotly_json().get(key), sort_keys=True, cls=PlotlyJSONEncoder)


def slider_figure(make_figure: Callable[[Any], go.Figure], values: Sequence[Any], *, label: str,
                  active: int = 0, value_text: Callable[[Any], str] = str) -> go.Figure:
    """One figure with a slider over ``values``; every frame is computed now, not in the browser.

    ``make_figure(value)`` draws one state. All frames must have the same number of traces; each
    frame keeps its own traces and its own title, annotations and shapes, while axes and the rest of
    the layout come from the first frame (set explicit axis ranges there if the data range moves).
    ``value_text`` turns a value into its slider label.
    """
    values = list(values)
    if not values:
        raise ValueError("values must not be empty")
    if not 0 <= active < len(values):
        raise ValueError(f"active must be in [0, {len(values)}), got {active}")
    labels = [value_text(v) for v in values]
    if len(set(labels)) != len(labels):
        raise ValueError(f"slider labels must be distinct, got {labels}")
    drawn = [_check_figure(make_figure(v)) for v in values]
    n_traces = {len(f.data) for f in drawn}
    if len(n_traces) != 1:
        raise ValueError(f"every frame must have the same number of traces, got {sorted(n_traces)}")
    # A layout part goes into the frames only if it changes between them (keeps the output small).
    moving = [k for k in FRAME_LAYOUT_KEYS
              if len({_layout_json(f, k) for f in drawn}) > 1]
    frames = [go.Frame(name=lab, data=f.data, layout={k: f.layout[k] for k in moving})
              for lab, f in zip(labels, drawn)]
    fig = go.Figure(data=drawn[active].data, layout=drawn[active].layout, frames=frames)
    fig.update_layout(_shared_axis_ranges(drawn))
    step_args = {"mode": "immediate", "frame": {"duration": 0, "redraw": True},
                 "transition": {"duration": 0}}
    fig.update_layout(
        sliders=[
            {
                "active": active,
                "currentvalue": {"prefix": f"{label} = "},
                "steps": [
                    {"label": lab, "method": "animate", "args": [[lab], step_args]}
                    for lab in labels
                ],
            }
        ]
    )
    return tidy_slider_layout(fig)


def _shared_axis_ranges(drawn: Sequence[go.Figure]) -> dict[str, Any]:
    """Numeric axis ranges that differ between frames, widened to hold every frame's range.

    Axes stay fixed across frames (so frames compare honestly); without this, a range set by each
    frame for its own data would clip the bars of every frame bigger than the one drawn first.
    """
    ranges: dict[str, list[tuple[float, float]]] = {}
    for fig in drawn:
        for key, axis in fig.layout.to_plotly_json().items():
            span = axis.get("range") if key.startswith(("xaxis", "yaxis")) else None
            if span is not None and all(isinstance(v, numbers.Number) for v in span):
                ranges.setdefault(key, []).append((float(span[0]), float(span[1])))
    return {f"{key}.range": [min(lo for lo, _ in spans), max(hi for _, hi in spans)]
            for key, spans in ranges.items() if len(set(spans)) > 1}


SLIDER_TOP_MARGIN_PX = 84
"""Room above the plot of a slider figure: the title on top, the legend in one or two rows below
it."""


def _legend_rows_px(fig: go.Figure) -> int:
    """Pixels a horizontal legend needs (a rough 24 px per row of about four entries)."""
    entries = sum(1 for t in fig.data if t.showlegend is not False and t.name)
    return 24 * max(1, -(-entries // 4))


def tidy_slider_layout(fig: go.Figure) -> go.Figure:
    """Lay out a slider figure so no two of its text boxes meet.

    The title sits at the top edge, the legend runs horizontally between the title and the plot
    (clear of subplot titles), and the slider hangs below the x-axis title with its value label,
    so the legend can never sit on the slider's label (the defect of a legend below the plot).
    """
    subplot_titles = any(
        getattr(a, "yref", None) == "paper" and (a.y or 0) >= 1 for a in fig.layout.annotations
    )
    legend_px = _legend_rows_px(fig)
    title_lines = 1 + str(fig.layout.title.text or "").count("<br>")
    top = max(
        fig.layout.margin.t or 0,
        SLIDER_TOP_MARGIN_PX
        + legend_px
        - 24
        + 22 * (title_lines - 1)
        + (26 if subplot_titles else 0),
    )
    height = fig.layout.height or 450
    plot_px = max(height - top - (fig.layout.margin.b or 80), 100)
    lift = (28 if subplot_titles else 6) / plot_px  # paper units above the plot area
    layout = fig.layout.to_plotly_json()
    has_x_title = any((axis.get("title") or {}).get("text") for key, axis in layout.items()
                      if key.startswith("xaxis"))
    fig.update_layout(
        title={"yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 14}},
        legend={"orientation": "h", "x": 0, "xanchor": "left", "y": 1 + lift, "yanchor": "bottom"},
        margin={"t": top},
    )
    fig.layout.sliders[0].pad = {"t": 70 if has_x_title else 40}
    return fig


# --------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------


def _cell_text(value: Any, fmt: str | Callable[[Any], str] | None) -> str:
    if fmt is None:
        if isinstance(value, (bool, np.bool_)):
            return yes_no(value)
        if isinstance(value, float):
            return f"{value:.4g}"
        return "" if value is None else str(value)
    return fmt(value) if callable(fmt) else format(value, fmt)


class Table:
    """Rows of computed values shown as an HTML table (a plain-text grid outside HTML front
    ends)."""

    def __init__(self, columns: Sequence[str], rows: Sequence[Sequence[str]],
                 numeric: Sequence[bool], caption: str | None = None) -> None:
        self.columns, self.rows, self.numeric, self.caption = list(columns), rows, numeric, caption

    def _repr_html_(self) -> str:
        def cells(tag: str, values: Iterable[str]) -> str:
            return "".join(
                f'<{tag} class="{"num" if num else "txt"}">{html.escape(v)}</{tag}>'
                for v, num in zip(values, self.numeric)
            )

        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        body = "".join(f"<tr>{cells('td', row)}</tr>" for row in self.rows)
        return (f'<table class="servelab-table">{caption}<thead><tr>{cells("th", self.columns)}'
                f"</tr></thead><tbody>{body}</tbody></table>")

    def __repr__(self) -> str:
        grid = [self.columns, *self.rows]
        widths = [max(len(r[i]) for r in grid) for i in range(len(self.columns))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in grid]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(([self.caption] if self.caption else []) + lines)


def table(rows: Sequence[Mapping[str, Any]] | Sequence[Sequence[Any]], *,
          columns: Sequence[str] | None = None, caption: str | None = None,
          formats: Mapping[str, str | Callable[[Any], str]] | None = None) -> Table:
    """A :class:`Table` from computed rows: dicts (their keys give the columns) or sequences.

    ``formats`` maps a column to a format spec (``".2f"``) or a function; unformatted floats show
    four significant digits and unformatted booleans read "yes" or "no". A column whose values are
    all numbers is right-aligned.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("a table needs at least one row")
    if isinstance(rows[0], Mapping):
        columns = list(columns) if columns is not None else list(rows[0])
        missing = [c for r in rows for c in columns if c not in r]
        if missing:
            raise ValueError(f"rows lack columns: {sorted(set(missing))}")
        values = [[r[c] for c in columns] for r in rows]
    else:
        if columns is None:
            raise ValueError("columns are required when rows are sequences")
        columns = list(columns)
        values = [list(r) for r in rows]
        bad = [i for i, r in enumerate(values) if len(r) != len(columns)]
        if bad:
            raise ValueError(f"rows {bad} do not have {len(columns)} cells")
    formats = dict(formats or {})
    unknown = set(formats) - set(columns)
    if unknown:
        raise ValueError(f"formats name unknown columns: {sorted(unknown)}")
    numeric = [all(isinstance(r[i], numbers.Number) and not isinstance(r[i], bool) for r in values)
               for i in range(len(columns))]
    text = [[_cell_text(v, formats.get(c)) for v, c in zip(r, columns)] for r in values]
    return Table(columns, text, numeric, caption)


# --------------------------------------------------------------------------------------------------
# Live controls
# --------------------------------------------------------------------------------------------------


SLIDER_WIDTH_PX = 520
"""Every live slider is this wide in total, so every panel's tracks have one length."""
SLIDER_LABEL_PX = 160
"""The width reserved for a slider's name (the longest, ``repetition_penalty``, fits)."""


def selection_slider(name: str, options: Sequence[Any], value: Any):
    """An ipywidgets SelectionSlider of the course's one size: label 160 px, whole control 520
    px."""
    import ipywidgets as widgets

    return widgets.SelectionSlider(options=list(options), value=value, description=name,
                                   continuous_update=False,
                                   style={"description_width": f"{SLIDER_LABEL_PX}px"},
                                   layout=widgets.Layout(width=f"{SLIDER_WIDTH_PX}px"))


def _defaults(make_figure: Callable[..., go.Figure],
              choices: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """Each control starts at the function's default when it has one, else at its first choice."""
    params = inspect.signature(make_figure).parameters
    unknown = set(choices) - set(params)
    if unknown:
        raise ValueError(f"make_figure has no parameters {sorted(unknown)}")
    start = {}
    for name, options in choices.items():
        default = params[name].default
        if default is not inspect.Parameter.empty and default not in options:
            raise ValueError(f"default {name}={default!r} is not one of its choices {options}")
        start[name] = options[0] if default is inspect.Parameter.empty else default
    return start


class LiveControls:
    """ipywidgets controls over ``make_figure`` in a kernel; a precomputed slider figure elsewhere.

    The output carries both: Jupyter and Colab render the live widget, the static book renders the
    twin (the book's config turns widget rendering off, so no dead control is ever shown).
    """

    def __init__(self, make_figure: Callable[..., go.Figure], sweep: str,
                 choices: Mapping[str, Sequence[Any]]) -> None:
        self.make_figure, self.sweep = make_figure, sweep
        self.choices = {k: list(v) for k, v in choices.items()}
        self.start = _defaults(make_figure, self.choices)

    def twin(self) -> go.Figure:
        """The static twin: a slider over the ``sweep`` choices, every other control at its
        start."""
        fixed = {k: v for k, v in self.start.items() if k != self.sweep}
        values = self.choices[self.sweep]
        return slider_figure(lambda v: self.make_figure(**fixed, **{self.sweep: v}), values,
                             label=self.sweep, active=values.index(self.start[self.sweep]))

    def widget(self):
        """The live control: one selection slider per parameter, redrawing on every change.

        While the book is built there is no reader for a live control, so the static twin is
        returned
        instead: no widget comm traffic reaches the build's notebook client (which can stall on it).
        """
        if in_book_build():
            return FigureOutput(self.twin())
        import ipywidgets as widgets

        sliders = {name: selection_slider(name, opts, self.start[name])
                   for name, opts in self.choices.items()}
        return widgets.interactive(lambda **kw: show(self.make_figure(**kw)), **sliders)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, Any]:
        bundle = FigureOutput(self.twin())._repr_mimebundle_()
        bundle.pop("application/vnd.plotly.v1+json", None)  # the live widget takes that role
        if not in_book_build():
            live = self.widget()._repr_mimebundle_()
            bundle["application/vnd.jupyter.widget-view+json"] = \
                live["application/vnd.jupyter.widget-view+json"]
        return bundle


def live_controls(make_figure: Callable[..., go.Figure], *, sweep: str,
                  **choices: Sequence[Any]) -> LiveControls:
    """Controls over the keyword parameters of ``make_figure``, each with a list of choices.

    Example: ``live_controls(draw, sweep="rate", rate=[1, 2, 4, 8], policy=["fcfs", "sjf"])``. In a
    kernel every parameter gets a slider; the static book shows a slider over ``sweep`` only, the
    others held at their defaults (the function's default, else the first choice).
    """
    if sweep not in choices:
        raise ValueError(f"sweep={sweep!r} must be one of the controls {sorted(choices)}")
    empty = [k for k, v in choices.items() if isinstance(v, (str, bytes)) or len(list(v)) == 0]
    if empty:
        raise ValueError(f"controls need a non-empty list of choices: {empty}")
    return LiveControls(make_figure, sweep, choices)
