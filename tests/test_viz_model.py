"""The model card's builders (servelab.viz.model): the curves drawn are the record's, the table its facts."""

from __future__ import annotations

import json
import math

import plotly.graph_objects as go
import pytest

from servelab.model import default_model_dir, draft_model_dir
from servelab.viz import model as vmod
from servelab.viz.core import Table


def card(steps=(0, 10, 20), val=(7.6, 5.0, 4.5), train=(None, 5.5, 4.6), vocab=2048, **over) -> dict:
    record = {
        "model_config": {"vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "max_position_embeddings": 32, "tie_word_embeddings": True},
        "settings": {"batch": 8, "lr": 3e-3, "warmup": 5},
        "curve": [{"step": s, "train_loss": t, "val_loss": v} for s, t, v in zip(steps, train, val)],
        "final_val_loss_nats_per_token": 4.4, "bits_per_char": 4.4 / math.log(2) / 2.5, "chars_per_token": 2.5,
        "parameters": 123_456, "steps": steps[-1], "tokens_seen": steps[-1] * 8 * 32, "wall_time_s": 61.4,
        "hardware": {"cpu_count": 2, "torch_threads": 2, "torch_version": "2.x", "device": "cpu",
                     "note": "a test box"},
    }
    return record | over


def test_two_traces_per_model_plus_the_uniform_line_and_units_on_the_axes():
    fig = vmod.loss_curve_figure({"big": card(), "small": card(val=(7.6, 6.0, 5.5))})
    assert isinstance(fig, go.Figure)
    assert [t.name for t in fig.data] == ["big: validation", "big: train", "small: validation", "small: train",
                                          "uniform over 2,048 tokens"]
    assert fig.layout.xaxis.title.text == "optimizer step"
    assert fig.layout.yaxis.title.text == "loss (nats/token)"
    assert fig.data[0].line.dash == "solid" and fig.data[1].line.dash == "dash"
    assert fig.data[0].line.color == fig.data[1].line.color != fig.data[2].line.color


def test_points_are_the_curve_and_step_zero_has_no_train_loss():
    fig = vmod.loss_curve_figure({"m": card()})
    val, train, uniform = fig.data
    assert list(val.x) == [0, 10, 20] and list(val.y) == [7.6, 5.0, 4.5]
    assert list(train.x) == [10, 20] and list(train.y) == [5.5, 4.6]
    assert list(uniform.x) == [0, 20] and uniform.y[0] == pytest.approx(math.log(2048))


def test_table_has_one_column_per_model_and_formats_the_facts():
    t = vmod.model_card_table({"big": card(), "small": card(parameters=99)})
    assert isinstance(t, Table)
    assert t.columns == ["", "big", "small"]
    rows = {r[0]: r[1:] for r in t.rows}
    assert rows["parameters"] == ["123,456", "99"]
    assert rows["attention heads / KV heads (head dim)"] == ["4 / 2 (16)"] * 2
    assert rows["vocabulary (tokens)"] == ["2,048"] * 2
    assert rows["final validation loss (nats/token)"] == ["4.400"] * 2
    assert rows["bits per character"] == [f"{4.4 / math.log(2) / 2.5:.3f}"] * 2
    assert rows["trained on"][0].startswith("a test box (2 torch threads on 2 CPUs")


@pytest.mark.parametrize("bad, error", [({}, ValueError), ({"m": []}, TypeError),
                                        ({"m": {"curve": []}}, ValueError),
                                        ({"m": card(curve=[])}, ValueError)])
def test_bad_cards_are_rejected(bad, error):
    with pytest.raises(error):
        vmod.loss_curve_figure(bad)
    with pytest.raises(error):
        vmod.model_card_table(bad)


def test_the_shipped_records_draw():
    cards = {name: json.loads((d / "training.json").read_text())
             for name, d in (("shipped", default_model_dir()), ("draft", draft_model_dir()))}
    fig = vmod.loss_curve_figure(cards)
    steps, losses = vmod.card_curve(cards["shipped"], "val")
    assert list(fig.data[0].x) == steps and list(fig.data[0].y) == losses
    assert steps[0] == 0 and steps[-1] == cards["shipped"]["steps"]
    table = vmod.model_card_table(cards)
    assert {r[0]: r[1] for r in table.rows}["parameters"] == f"{cards['shipped']['parameters']:,d}"
