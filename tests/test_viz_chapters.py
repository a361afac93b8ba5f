"""The figure builders of the metrics and sampling chapters: right frames, right traces, bad input rejected."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from servelab import metrics as m
from servelab.metrics import roofline
from servelab import sampling as smp
from servelab.viz import metrics as vm
from servelab.viz import sampling as vs
from servelab.viz.core import LiveControls

LOGITS = [4.0, 3.0, 2.0, 1.0]
LABELS = ["cat", "dog", "bird", "car"]
A100 = ("A100-class", 312e12, 1.55e12)
BIG = roofline.ModelShape(70_000_000_000, 80, 8192, 8, 128, 2)


def timing() -> m.RequestTiming:
    return m.RequestTiming(0.0, 0.01, (0.05, 0.06, 0.075, 0.08), 0.08, prompt_tokens=10)


# --- sampling ---------------------------------------------------------------------------------------


def test_pipeline_view_keeps_both_ends_of_truncation():
    view = vs.pipeline_view(LOGITS, smp.SamplingParams(temperature=2, top_k=3, top_p=0.8))
    assert view.support == [0, 1]
    np.testing.assert_allclose(view.after[:2], [0.62246, 0.37754], atol=1e-5)
    assert view.kept_mass == pytest.approx(view.before[0] + view.before[1])


def test_greedy_view_is_one_hot_with_softmax_before():
    view = vs.pipeline_view(LOGITS, smp.SamplingParams(temperature=0))
    assert view.support == [0]
    np.testing.assert_allclose(view.before, smp.softmax(LOGITS))


def test_distribution_figure_colours_cut_tokens():
    fig = vs.distribution_figure(LOGITS, LABELS, smp.SamplingParams(top_p=0.8))
    assert len(fig.data) == 2
    colours = list(fig.data[0].marker.color)
    assert colours[:2] == [vs.KEPT_COLOR] * 2 and colours[2:] == [vs.CUT_COLOR] * 2
    assert "support (2 tokens)" in fig.layout.title.text


def test_slider_figure_has_one_frame_per_value():
    values = [0.5, 0.8, 0.95, 1.0]
    fig = vs.distribution_slider_figure(LOGITS, LABELS, param="top_p", values=values, active=1)
    assert len(fig.frames) == len(values)
    assert all(len(frame.data) == 2 for frame in fig.frames)
    assert len(fig.layout.sliders[0].steps) == len(values)
    assert "support (1 token)" in fig.frames[0].layout.title.text


def test_show_top_limits_drawn_tokens_not_support():
    logits = np.linspace(3, -3, 50)
    fig = vs.distribution_figure(logits, [str(i) for i in range(50)], smp.SamplingParams(), show_top=10)
    assert len(fig.data[0].x) == 10
    assert "support (50 tokens)" in fig.layout.title.text


@pytest.mark.parametrize("kwargs, error", [
    ({"param": "seed", "values": [0, 1]}, ValueError),
    ({"param": "top_p", "values": [0.5]}, ValueError),
    ({"param": "top_p", "values": [0.5, 0.9], "active": 2}, ValueError),
])
def test_slider_figure_rejects_bad_sweeps(kwargs, error):
    with pytest.raises(error):
        vs.distribution_slider_figure(LOGITS, LABELS, **kwargs)


def test_labels_must_cover_the_vocabulary():
    with pytest.raises(ValueError):
        vs.distribution_figure(LOGITS, LABELS[:3], smp.SamplingParams())
    with pytest.raises(ValueError):
        vs.distribution_figure(LOGITS, LABELS, smp.SamplingParams(), show_top=0)


def test_support_size_figure_one_line_per_setting():
    settings = {"top-k 2": smp.SamplingParams(top_k=2), "min-p 0.3": smp.SamplingParams(min_p=0.3)}
    fig = vs.support_size_figure([4, 3, 2, 1, 0], [0.2, 1.0, 5.0], settings)
    assert [trace.name for trace in fig.data] == list(settings)
    assert list(fig.data[0].y) == [2, 2, 2]
    assert list(fig.data[1].y) == [1, 2, 5]
    with pytest.raises(ValueError):
        vs.support_size_figure(LOGITS, [0.0, 1.0], settings)


def test_logit_comparison_figure_marks_seen_tokens_and_checks_lengths():
    fig = vs.logit_comparison_figure(LABELS, {"a": LOGITS, "b": LOGITS}, highlight=[1])
    assert len(fig.data) == 2 and list(fig.data[0].x)[1] == "dog*"
    with pytest.raises(ValueError):
        vs.logit_comparison_figure(LABELS, {"a": LOGITS[:2]})


def test_sampling_controls_have_a_static_twin():
    controls = vs.sampling_controls(LOGITS, LABELS)
    assert isinstance(controls, LiveControls)
    twin = controls.twin()
    assert len(twin.frames) == len(vs.CONTROL_CHOICES["temperature"])


def test_generation_controls_need_a_callable():
    with pytest.raises(TypeError):
        vs.generation_controls("not callable")


def test_token_label_makes_whitespace_visible():
    assert vs.token_label(" the\n") == "␣the↵"
    assert vs.token_label("") == "∅"


# --- metrics ----------------------------------------------------------------------------------------


def test_timeline_figure_traces_and_identity_in_title():
    fig = vm.timeline_figure(timing())
    # queueing + TTFT + 3 ITL spans + emit markers + ITL bars + TPOT line
    assert len(fig.data) == 8
    assert "(the identity holds)" in fig.layout.title.text


def test_timeline_figure_rejects_bad_input():
    with pytest.raises(TypeError):
        vm.timeline_figure((0.0, [1.0, 2.0]))
    with pytest.raises(ValueError):
        vm.timeline_figure(m.RequestTiming(0.0, 0.0, (0.1,), 0.1))
    with pytest.raises(ValueError):
        vm.timeline_figure(timing(), unit="minutes")
    with pytest.raises(ValueError):
        vm.timeline_figure(timing(), token_texts=["a"])


def test_load_sweep_figure_checks_shapes_and_fraction():
    fig = vm.load_sweep_figure([1, 2, 3], [1, 2, 2.5], [1, 1.8, 1], [1, 0.9, 0.4])
    assert len(fig.data) == 4
    with pytest.raises(ValueError):
        vm.load_sweep_figure([1, 2], [1, 2], [1, 2], [1, 1.5])
    with pytest.raises(ValueError):
        vm.load_sweep_figure([1, 2, 3], [1, 2], [1, 2], [1, 1])


def test_roofline_figure_names_ridges_and_points_in_the_legend():
    fig = vm.roofline_figure({"A100-class": A100[1:], "H100-class": (989e12, 3.35e12)}, {"k": 1.0})
    assert [t.name for t in fig.data] == ["A100-class roof", "H100-class roof", "A100-class ridge I* = 201.3",
                                          "H100-class ridge I* = 295.2", "k"]
    assert not fig.layout.annotations and all(t.mode in ("lines", "markers") for t in fig.data)
    assert list(fig.data[2].x) == pytest.approx([201.3, 201.3], abs=0.05)
    with pytest.raises(ValueError):
        vm.roofline_figure({})


def test_measured_roofline_places_points_where_they_ran_and_reaches_down_to_them():
    fig = vm.measured_roofline_figure({"CPU": (80e9, 15e9)}, {"slow step": (0.5, 1e6), "fast step": (4.0, 3e10)})
    assert [t.name for t in fig.data] == ["CPU roof", "CPU ridge I* = 5.3", "slow step", "fast step"]
    assert (fig.data[2].x[0], fig.data[2].y[0]) == (0.5, 1e6)  # achieved, not the roof above it (7.5e9)
    assert min(fig.data[1].y) == 1e6  # the ridge line reaches the lowest point
    with pytest.raises(ValueError):
        vm.measured_roofline_figure({"CPU": (80e9, 15e9)}, {})


def test_roofline_slider_one_frame_per_batch_with_fixed_axis():
    batches = [1, 8, 64]
    fig = vm.roofline_batch_slider_figure(A100, {"70B": (BIG, 512, 512)}, batches)
    assert len(fig.frames) == len(batches)
    assert all(len(frame.data) == 4 for frame in fig.frames)  # roof + ridge + prefill + decode
    decode_x = [frame.data[3].x[0] for frame in fig.frames]
    assert decode_x == sorted(decode_x)
    with pytest.raises(ValueError):
        vm.roofline_batch_slider_figure(A100, {"70B": (BIG, 512, 512)}, [1])
    with pytest.raises(ValueError):
        vm.roofline_phase_figure(A100, {}, batch=1)


def test_latency_percentile_figure_bars_per_sample():
    fig = vm.latency_percentile_figure({"a": [0.01] * 200, "b": [0.02] * 200}, (50, 99))
    assert len(fig.data) == 2 and list(fig.data[1].y) == pytest.approx([20.0, 20.0])
    assert isinstance(fig, go.Figure)
    with pytest.raises(ValueError):
        vm.latency_percentile_figure({})


def test_probability_axis_fits_flat_distributions_across_frames():
    flat = np.zeros(100)
    fig = vs.distribution_slider_figure(flat, [str(i) for i in range(100)], param="temperature",
                                        values=[0.5, 1.0], show_top=10)
    assert fig.layout.yaxis.range[1] == pytest.approx(1.15 * 0.01)


def test_support_caption_quotes_tokens_and_byte_tokens_read_as_bytes():
    from servelab.model.tokenizer import load_tokenizer

    labels = vs.vocab_labels(load_tokenizer())
    assert "\ufffd" not in "".join(labels) and labels[0] == "<|endoftext|>"
    byte_only = [label for label in labels if label.startswith("\\x")]
    assert byte_only and all(len(label) >= 4 for label in byte_only)
    assert "↵" in labels and "?" in labels  # the question-mark token is a real token ...
    fig = vs.distribution_figure([1.0, 9.0, 0.0], ["a", "?", "\\xe2"], smp.SamplingParams(min_p=0.1))
    title = fig.layout.title.text
    assert "support (1 token)" in title and title.endswith("<br>{“?”}")  # ... and reads as one, quoted


def test_every_live_control_has_a_static_slider_figure():
    figs = vs.control_slider_figures(LOGITS, LABELS, output_ids=[0, 0, 1])
    assert set(figs) == {"top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"}
    top_k = figs["top_k"].layout.sliders[0]
    assert [s.label for s in top_k.steps][-1] == str(len(LOGITS)) and top_k.active == len(top_k.steps) - 1
    for name, fig in figs.items():
        bars = {tuple(round(y, 6) for y in frame.data[1].y) for frame in fig.frames}
        assert len(bars) > 1, name  # moving the slider changes the distribution drawn


def test_generation_sliders_share_one_wide_track():
    import ipywidgets as w

    box = vs.generation_controls(lambda params: "text")
    sliders = [c for c in box.children if isinstance(c, w.SelectionSlider)]
    assert len(sliders) == len(vs.CONTROL_CHOICES)
    widths = {s.layout.width for s in sliders}
    labels = {s.style.description_width for s in sliders}
    assert len(widths) == 1 and len(labels) == 1
    track = int(widths.pop().removesuffix("px")) - int(labels.pop().removesuffix("px"))
    assert track > 3 * 55


def test_slider_figure_widens_axis_ranges_and_keeps_text_apart():
    from servelab.viz.core import slider_figure

    def draw(scale):
        fig = go.Figure([go.Bar(x=["a", "b"], y=[scale, 2 * scale], name="one"),
                         go.Bar(x=["a", "b"], y=[1, 1], name="two")])
        return fig.update_layout(yaxis_range=[0, 2.2 * scale], xaxis_title="x", title=f"scale {scale}",
                                 legend={"orientation": "h", "y": -0.2})

    fig = slider_figure(draw, [1, 10, 100], label="scale")
    assert list(fig.layout.yaxis.range) == pytest.approx([0, 220])  # the biggest frame fits, not only the first
    assert fig.layout.legend.y > 1 and fig.layout.legend.yanchor == "bottom"  # legend above the plot
    assert fig.layout.sliders[0].pad.t >= 70  # the slider's label hangs below the x-axis title


def test_support_caption_names_the_most_probable_tokens_first():
    fig = vs.distribution_figure([1.0, 3.0, 2.0, 0.0], ["a", "b", "c", "d"], smp.SamplingParams(top_k=3))
    assert fig.layout.title.text.endswith("<br>{“b”, “c”, “a”}")
