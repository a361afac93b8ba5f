"""Tests for servelab.viz.core (shared display helpers) and servelab.viz.lifecycle (the state diagram)."""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go
import pytest

from servelab.lifecycle.state_machine import STATE_TABLE, TRANSITIONS, RequestState
from servelab.viz import core
from servelab.viz import lifecycle as vl


def line(v: float) -> go.Figure:
    return go.Figure(go.Scatter(x=[0, 1], y=[0, v]), layout={"title": {"text": f"v={v}"}})


# -- figures -----------------------------------------------------------------------------------------


def spec_of(html: str) -> dict:
    return json.loads(re.search(r"var spec = (\{.*\});\n", html).group(1).replace("<\\/", "</"))


def test_figure_html_draws_with_the_pages_plotly_and_never_embeds_it():
    html = core.figure_html(line(2))
    assert 'class="servelab-figure"' in html
    assert "Plotly.newPlot" in html and "if (window.Plotly)" in html
    assert "plotly.js v" not in html and len(html) < 50_000  # no 4.9 MB bundle inside
    assert spec_of(html)["data"][0]["y"] == [0, 2]


def test_figure_ids_are_unique_and_stable_in_form():
    a, b = core.figure_html(line(1)), core.figure_html(line(1))
    ids = [re.search(r'id="(servelab-fig-[0-9a-f]{12})"', h).group(1) for h in (a, b)]
    assert ids[0] != ids[1]


def test_script_cannot_be_closed_by_figure_text():
    html = core.figure_html(go.Figure(layout={"title": {"text": "</script><b>x"}}))
    assert html.count("</script>") == 1
    assert spec_of(html)["layout"]["title"]["text"] == "</script><b>x"


def test_figure_output_mime_types_depend_on_the_book_build(monkeypatch):
    monkeypatch.delenv(core.BOOK_BUILD_ENV, raising=False)
    live = core.FigureOutput(line(1))._repr_mimebundle_()
    assert {"text/html", "text/plain", "application/vnd.plotly.v1+json"} <= set(live)
    monkeypatch.setenv(core.BOOK_BUILD_ENV, "1")
    book = core.FigureOutput(line(1))._repr_mimebundle_()
    assert set(book) == {"text/html", "text/plain"}


@pytest.mark.parametrize("bad", [None, {"data": []}, "fig"])
def test_figure_helpers_reject_non_figures(bad):
    with pytest.raises(TypeError, match="plotly.graph_objects.Figure"):
        core.figure_html(bad)


def test_slider_figure_precomputes_one_frame_per_value():
    fig = core.slider_figure(line, [1, 2, 3], label="v", active=1)
    assert [f.name for f in fig.frames] == ["1", "2", "3"]
    assert [f.data[0].y[1] for f in fig.frames] == [1, 2, 3]
    assert fig.frames[2].layout.title.text == "v=3"
    assert fig.data[0].y[1] == 2  # starts on the active value
    slider = fig.layout.sliders[0]
    assert slider.active == 1 and [list(s.args[0]) for s in slider.steps] == [["1"], ["2"], ["3"]]


def test_slider_figure_validates_its_arguments():
    with pytest.raises(ValueError, match="empty"):
        core.slider_figure(line, [], label="v")
    with pytest.raises(ValueError, match="active"):
        core.slider_figure(line, [1], label="v", active=1)
    with pytest.raises(ValueError, match="distinct"):
        core.slider_figure(line, [1, 2], label="v", value_text=lambda v: "same")

    def ragged(v: int) -> go.Figure:
        return go.Figure([go.Scatter(y=[v])] * v)

    with pytest.raises(ValueError, match="same number of traces"):
        core.slider_figure(ragged, [1, 2], label="v")


# -- tables ------------------------------------------------------------------------------------------


def test_table_from_dicts_formats_escapes_and_aligns():
    t = core.table([{"name": "a<b", "p": 0.123456, "n": 3}, {"name": "c", "p": 1.0, "n": 10}],
                   formats={"p": ".2f"}, caption="demo")
    html = t._repr_html_()
    assert "a&lt;b" in html and "<caption>demo</caption>" in html
    assert '<td class="num">0.12</td>' in html and '<td class="num">10</td>' in html
    assert '<td class="txt">c</td>' in html
    text = repr(t)
    assert text.splitlines()[0] == "demo" and "0.12" in text


def test_table_writes_booleans_as_words():
    import numpy as np

    t = core.table([{"same": True, "flag": np.bool_(False), "kept": 1}], formats={"kept": lambda v: str(v == 1)})
    html = t._repr_html_()
    assert '<td class="txt">yes</td><td class="txt">no</td>' in html and "True" in html  # formats win
    assert "True" not in repr(core.table([{"same": True}]))


def test_table_from_sequences_needs_columns_of_the_right_width():
    assert "x" in core.table([[1, "x"]], columns=["n", "s"])._repr_html_()
    with pytest.raises(ValueError, match="columns are required"):
        core.table([[1, 2]])
    with pytest.raises(ValueError, match="do not have 2 cells"):
        core.table([[1, 2, 3]], columns=["a", "b"])
    with pytest.raises(ValueError, match="at least one row"):
        core.table([])
    with pytest.raises(ValueError, match="lack columns"):
        core.table([{"a": 1}, {"b": 2}])
    with pytest.raises(ValueError, match="unknown columns"):
        core.table([{"a": 1}], formats={"z": "d"})


# -- publishing and live controls --------------------------------------------------------------------


def test_publish_rejects_names_the_glue_roles_cannot_use():
    with pytest.raises(ValueError, match="identifier"):
        core.publish("ch00-x", 1)


def test_live_controls_twin_sweeps_one_control_and_holds_the_others(monkeypatch):
    monkeypatch.setenv(core.BOOK_BUILD_ENV, "1")
    seen = []

    def draw(rate: int = 2, policy: str = "fcfs") -> go.Figure:
        seen.append((rate, policy))
        return line(rate)

    controls = core.live_controls(draw, sweep="rate", rate=[1, 2, 4], policy=["sjf", "fcfs"])
    twin = controls.twin()
    assert [f.name for f in twin.frames] == ["1", "2", "4"] and twin.layout.sliders[0].active == 1
    assert {p for _, p in seen} == {"fcfs"}
    bundle = controls._repr_mimebundle_()
    assert "text/html" in bundle and "application/vnd.jupyter.widget-view+json" not in bundle


def test_live_controls_widget_is_the_static_twin_during_the_book_build(monkeypatch):
    controls = core.live_controls(lambda rate=2: line(rate), sweep="rate", rate=[1, 2, 4])
    monkeypatch.setenv(core.BOOK_BUILD_ENV, "1")
    built = controls.widget()
    assert isinstance(built, core.FigureOutput)  # no ipywidgets (and no comm traffic) in the build
    monkeypatch.delenv(core.BOOK_BUILD_ENV)
    import ipywidgets

    assert isinstance(controls.widget(), ipywidgets.interactive)  # a live kernel gets real sliders


def test_live_controls_validation():
    with pytest.raises(ValueError, match="sweep"):
        core.live_controls(line, sweep="w", v=[1])
    with pytest.raises(ValueError, match="non-empty"):
        core.live_controls(line, sweep="v", v=[])
    with pytest.raises(ValueError, match="no parameters"):
        core.live_controls(line, sweep="v", v=[1], other=[2])
    with pytest.raises(ValueError, match="not one of its choices"):
        core.live_controls(lambda v=5: line(v), sweep="v", v=[1, 2])


# -- the state machine -------------------------------------------------------------------------------


def test_happy_path_is_made_of_allowed_transitions():
    vl.check_path(vl.HAPPY_PATH)
    with pytest.raises(ValueError, match="not an allowed transition"):
        vl.check_path([RequestState.ARRIVED, RequestState.DECODE])


def test_layout_places_every_state_by_its_role():
    points = vl.layout()
    assert set(points) == set(TRANSITIONS)
    main = [s for s in vl.HAPPY_PATH if not STATE_TABLE[s].terminal]
    assert [points[s].x for s in main] == sorted(points[s].x for s in main)
    for state, point in points.items():
        expected = "terminal" if STATE_TABLE[state].terminal else "main" if state in main else "side"
        assert point.row == expected
    for row in ("main", "side", "terminal"):
        xs = sorted(p.x for p in points.values() if p.row == row)
        assert all(b - a >= vl.MIN_GAP - 1e-9 for a, b in zip(xs, xs[1:])), row


def test_state_diagram_draws_every_transition_and_every_state():
    fig = vl.state_diagram(RequestState.DECODE)
    n_edges = sum(len(v) for v in TRANSITIONS.values())
    assert len(fig.layout.annotations) == n_edges
    states = fig.data[0]
    assert len(states.x) == len(TRANSITIONS)
    assert list(states.marker.color).count(vl.COLORS["current"]) == 1
    hover = states.hovertext[list(TRANSITIONS).index(RequestState.QUEUED)]
    assert "guard" in hover and "KV_RESERVATION".lower() in hover


def test_journey_figure_has_a_frame_per_step_with_the_time_spent():
    history = [(RequestState.ARRIVED, 0.0), (RequestState.VALIDATED, 0.001),
               (RequestState.QUEUED, 0.003), (RequestState.PREFILL, 0.004),
               (RequestState.DECODE, 0.010), (RequestState.FINISHED, 0.050)]
    fig = vl.journey_figure(history)
    assert len(fig.frames) == len(history)
    assert "stayed 2 ms" in fig.frames[1].layout.title.text
    assert "final" in fig.frames[-1].layout.title.text
    with pytest.raises(ValueError, match="must not decrease"):
        vl.journey_figure([(RequestState.ARRIVED, 1.0), (RequestState.VALIDATED, 0.5)])


def test_state_table_has_a_row_per_state():
    t = vl.state_table()
    assert len(t.rows) == len(STATE_TABLE)
    assert t.columns[0] == "state" and "cleanup" in t.columns[3]


def test_published_floats_drop_the_bits_that_differ_between_cpus():
    import numpy as np

    # Two results that differ only in their last bits (as AVX2 and AVX-512 paths can) publish alike.
    a, b = 0.1 + 0.2, 0.3
    assert a != b and core.published_value(a) == core.published_value(b) == 0.3
    assert core.published_value(np.float64(1 / 3)) == 0.333333333333
    assert type(core.published_value(np.float32(0.5))) is float
    assert core.published_value(np.int64(7)) == 7 and type(core.published_value(np.int64(7))) is int
    assert core.published_value({"x": [1 / 3, (2 / 3, "s")]}) == {"x": [0.333333333333, (0.666666666667, "s")]}
    assert core.published_value(True) is True and core.published_value("0.1234567890123456") == "0.1234567890123456"
