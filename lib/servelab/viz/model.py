"""The model card: the tiny model's loss curves and its architecture and training facts.

What is drawn comes from the ``training.json`` record that ``python -m servelab.model.train`` writes
next to a checkpoint (:func:`servelab.model.default_model_dir`,
:func:`servelab.model.draft_model_dir`); this module only arranges it. A *card* is that record
parsed as a dict. Losses are mean next-token cross-entropies in nats per token, steps count
optimizer updates.

:func:`loss_curve_figure` returns a ``plotly.graph_objects.Figure`` (pass it to
``servelab.viz.show``); :func:`model_card_table` returns a :class:`servelab.viz.core.Table`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from servelab.model.llama import LlamaConfig
from servelab.viz.core import Table, table

__all__ = ["CARD_KEYS", "card_curve", "loss_curve_figure", "model_card_table"]

CARD_KEYS = ("model_config", "settings", "curve", "final_val_loss_nats_per_token", "bits_per_char",
             "chars_per_token", "parameters", "steps", "tokens_seen", "wall_time_s", "hardware")
"""Keys of a ``training.json`` record that the card's figure and table read."""

PALETTE = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a")
UNIFORM_COLOR = "#969696"


def _check_cards(cards: Mapping[str, Mapping[str, Any]]) -> None:
    if not isinstance(cards, Mapping) or not cards:
        raise ValueError("cards must be a non-empty mapping of model name -> training.json record")
    for name, card in cards.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"model names must be non-empty strings, got {name!r}")
        if not isinstance(card, Mapping):
            raise TypeError(
                f"card {name!r} must be a mapping (a parsed training.json), got "
                f"{type(card).__name__}"
            )
        missing = [k for k in CARD_KEYS if k not in card]
        if missing:
            raise ValueError(f"card {name!r} lacks keys: {', '.join(missing)}")
        if not card["curve"]:
            raise ValueError(f"card {name!r} has an empty loss curve")


def card_curve(card: Mapping[str, Any], which: str) -> tuple[list[int], list[float]]:
    """``(steps, losses)`` of one curve of a card: ``which`` is ``"train"`` or ``"val"``.

    Losses are in nats/token. The train loss is the mean over the steps since the previous point, so
    step 0 (before any update) has none and is left out.
    """
    if which not in ("train", "val"):
        raise ValueError(f"which must be 'train' or 'val', got {which!r}")
    key = f"{which}_loss"
    points = [(int(p["step"]), float(p[key])) for p in card["curve"] if p.get(key) is not None]
    return [s for s, _ in points], [v for _, v in points]


def loss_curve_figure(
    cards: Mapping[str, Mapping[str, Any]], *, title: str | None = None
) -> go.Figure:
    """Train and validation loss (nats/token) against optimizer step, two traces per model.

    ``cards`` maps a model's display name to its parsed ``training.json``. Validation is a solid
    line, training a dashed one in the same colour. A dotted line marks ln(vocabulary size), the
    loss of a uniform guess over the vocabulary: where an untrained model starts.
    """
    _check_cards(cards)
    fig = go.Figure()
    for i, (name, card) in enumerate(cards.items()):
        colour = PALETTE[i % len(PALETTE)]
        for which, label, dash in (("val", "validation", "solid"), ("train", "train", "dash")):
            steps, losses = card_curve(card, which)
            fig.add_trace(go.Scatter(
                x=steps, y=losses, mode="lines+markers", name=f"{name}: {label}", legendgroup=name,
                line={"color": colour, "dash": dash}, marker={"size": 6},
                hovertemplate=f"step %{{x}}: %{{y:.3f}} nats/token<extra>{name} {label}</extra>"))
    last_step = max(max(int(p["step"]) for p in c["curve"]) for c in cards.values())
    for vocab in sorted({int(c["model_config"]["vocab_size"]) for c in cards.values()}):
        fig.add_trace(
            go.Scatter(
                x=[0, last_step],
                y=[math.log(vocab)] * 2,
                mode="lines",
                name=f"uniform over {vocab:,} tokens",
                line={"color": UNIFORM_COLOR, "dash": "dot"},
                hovertemplate=f"ln {vocab} = %{{y:.3f}} nats/token<extra></extra>",
            )
        )
    fig.update_layout(
        height=420, title=title or "Loss while training (lower is better)",
        xaxis_title="optimizer step", yaxis_title="loss (nats/token)",
        legend={"orientation": "h", "y": -0.2}, hovermode="closest")
    return fig


def _hardware_line(hardware: Mapping[str, Any]) -> str:
    """The ``hardware`` record as one line: the free-text note, then threads and torch version."""
    parts = [
        f"{hardware.get('torch_threads', '?')} torch threads on "
        f"{hardware.get('cpu_count', '?')} CPUs",
        f"torch {hardware.get('torch_version', '?')}",
        f"device {hardware.get('device', '?')}",
    ]
    note = str(hardware.get("note") or "").strip()
    return (f"{note} ({', '.join(parts)})" if note else ", ".join(parts))


def model_card_table(
    cards: Mapping[str, Mapping[str, Any]], *, caption: str | None = None
) -> Table:
    """One row per architecture or training fact, one column per model (units in the row labels).

    Every cell is read from the card; bits per character is the card's own figure
    (final validation loss / ln 2 / characters per token).
    """
    _check_cards(cards)

    def facts(card: Mapping[str, Any]) -> dict[str, str]:
        cfg, settings = card["model_config"], card["settings"]
        head_dim = LlamaConfig.from_hf_dict(cfg).head_dim  # derived from width / heads when absent
        return {
            "layers": f"{cfg['num_hidden_layers']:d}",
            "width (hidden size)": f"{cfg['hidden_size']:d}",
            "attention heads / KV heads (head dim)":
                f"{cfg['num_attention_heads']:d} / {cfg['num_key_value_heads']:d} ({head_dim:d})",
            "SwiGLU FFN size": f"{cfg['intermediate_size']:d}",
            "context (tokens)": f"{cfg['max_position_embeddings']:d}",
            "vocabulary (tokens)": f"{cfg['vocab_size']:,d}",
            "tied embeddings": "yes" if cfg.get("tie_word_embeddings") else "no",
            "parameters": f"{card['parameters']:,d}",
            "optimizer steps": f"{card['steps']:,d}",
            "batch (sequences/step)": f"{settings['batch']:d}",
            "peak learning rate (warm-up steps)": f"{settings['lr']:g} ({settings['warmup']:d})",
            "tokens seen": f"{card['tokens_seen']:,d}",
            "wall time (s)": f"{card['wall_time_s']:,.0f}",
            "trained on": _hardware_line(card["hardware"]),
            "final validation loss (nats/token)": f"{card['final_val_loss_nats_per_token']:.3f}",
            "bits per character": f"{card['bits_per_char']:.3f}",
            "characters per token": f"{card['chars_per_token']:.3f}",
        }

    per_model = {name: facts(card) for name, card in cards.items()}
    labels = list(next(iter(per_model.values())))
    rows = [[label, *(f[label] for f in per_model.values())] for label in labels]
    return table(rows, columns=["", *per_model], caption=caption)
