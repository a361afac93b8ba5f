"""Log axes label major decades only, in full, and their labels read in increasing order."""

from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
import pytest

from servelab.viz.core import figure_html
from servelab.viz.ticks import label_log_axes, log_ticks, tick_text


def test_tick_text_writes_values_in_full():
    assert [tick_text(v) for v in (1, 10, 1000, 2000, 1e4, 2e5, 1e6, 1e12)] == \
        ["1", "10", "1,000", "2,000", "10k", "200k", "1M", "1T"]
    assert tick_text(0.01) == "0.01" and tick_text(1e-5) == "1e-5"


def test_wide_ranges_get_decades_and_narrow_ones_1_2_5():
    assert log_ticks(3, 4000) == [1.0, 10.0, 100.0, 1000.0, 10000.0]
    narrow = log_ticks(3, 9)
    assert narrow == sorted(narrow) and 5.0 in narrow and all(str(v)[0] in "125" for v in narrow)
    with pytest.raises(ValueError):
        log_ticks(0, 1)


def _spec(fig: go.Figure) -> dict:
    html = figure_html(fig)
    return json.loads(html.split("var spec = ", 1)[1].split(";\n", 1)[0].replace("<\\/", "</"))


def test_every_log_axis_of_a_figure_is_labelled_in_increasing_order():
    fig = go.Figure(go.Scatter(x=np.array([2.0, 30.0, 700.0]), y=[5, 6, 7]))
    fig.add_trace(go.Scatter(x=[1, 2], y=[3, 40], xaxis="x2", yaxis="y2"))
    fig.update_layout(xaxis_type="log", xaxis2=dict(type="log", anchor="y2"), yaxis2=dict(anchor="x2"))
    layout = _spec(fig)["layout"]
    for key in ("xaxis", "xaxis2"):
        values = layout[key]["tickvals"]
        assert values == sorted(values) and layout[key]["minor"]["dtick"] == "D1"
        assert [float(t.replace(",", "")) for t in layout[key]["ticktext"]] == values  # labels in full
    assert layout["xaxis"]["ticktext"] == ["1", "10", "100", "1,000"]
    assert "tickvals" not in layout.get("yaxis", {})  # a linear axis is left alone


def test_an_axis_with_its_own_ticks_is_left_alone():
    spec = {"data": [{"x": [1, 1000], "y": [1, 2]}],
            "layout": {"xaxis": {"type": "log", "tickvals": [1, 1000]}}}
    assert label_log_axes(spec)["layout"]["xaxis"] == {"type": "log", "tickvals": [1, 1000]}
