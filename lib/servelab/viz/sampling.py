"""Figures and controls for the sampling chapter: what the sampler sees, keeps and draws from.

Every probability drawn here comes from :mod:`servelab.sampling`; this module only arranges it.
Two kinds of output:

* plotly figures (static-HTML friendly): :func:`distribution_figure` for one setting,
  :func:`distribution_slider_figure` for a sweep of one parameter whose frames are all computed up
  front, :func:`support_size_figure` for "how many tokens survive as temperature changes" and
  :func:`logit_comparison_figure` for penalties;
* ipywidgets controls for a live kernel: :func:`sampling_controls` (sliders drive
  :func:`servelab.sampling.next_token_distribution`) and :func:`generation_controls` (the same
  sliders drive a text generator the caller supplies).

A *view* (:class:`DistributionView`) pairs the distribution the truncation filters received with the
one they returned, so a figure can show both the kept set and the mass it carried.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go

from servelab import sampling as smp
from servelab.viz.core import LiveControls, live_controls, selection_slider, slider_figure

if TYPE_CHECKING:
    import ipywidgets

__all__ = [
    "CONTROL_CHOICES",
    "DistributionView",
    "distribution_figure",
    "distribution_slider_figure",
    "generation_controls",
    "logit_comparison_figure",
    "pipeline_view",
    "sampling_controls",
    "support_size_figure",
    "control_slider_figures",
    "token_label",
    "vocab_labels",
]

KEPT_COLOR = "#2c7fb8"
CUT_COLOR = "#c9c9c9"
FINAL_COLOR = "#d95f0e"
SWEEPABLE = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty",
             "frequency_penalty", "presence_penalty")
"""SamplingParams fields a slider figure may sweep."""


def token_label(text: str) -> str:
    """A printable label for a decoded token: spaces become ``␣``, newlines ``↵``, tabs ``⇥``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍") or "∅"


def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's alphabet inverted: the printable character that stands for each byte.

    Bytes that are printable Latin-1 stand for themselves; the other 68 are shifted to 256 and up,
    in byte order (the GPT-2 convention the ``tokenizers`` ByteLevel pre-tokenizer uses).
    """
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    alphabet, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(256 + shifted)] = byte
            shifted += 1
    return alphabet


_BYTES = _byte_alphabet()


def _piece_label(piece: str) -> str:
    """A vocabulary entry as a reader should see it: its text, or ``\\xNN`` for bytes that are not
    text."""
    if not all(ch in _BYTES for ch in piece):
        return piece  # a special token such as <|endoftext|>, shown by name
    text = bytes(_BYTES[ch] for ch in piece).decode("utf-8", errors="backslashreplace")
    return token_label(text)


def vocab_labels(tokenizer) -> list[str]:
    """One readable label per token id of a byte-level BPE ``tokenizers.Tokenizer``.

    Whitespace is made visible (``␣``, ``↵``, ``⇥``), a token that holds part of a multi-byte
    character shows its bytes (``\\xe2\\x80``) instead of the replacement character, and a special
    token shows its name. Decoding a lone byte token would print "?"-like replacement characters.
    """
    return [_piece_label(tokenizer.id_to_token(i)) for i in range(tokenizer.get_vocab_size())]


@dataclass(frozen=True)
class DistributionView:
    """One decode step under one :class:`~servelab.sampling.SamplingParams`.

    ``before`` is the distribution the truncation filters received (after hard constraints,
    penalties and temperature; at ``T = 0`` the plain softmax of the penalised logits). ``after`` is
    the distribution the token is drawn from. ``support`` lists the ids ``after`` keeps, and
    ``kept_mass`` is how much of ``before`` those ids carried.
    """

    params: smp.SamplingParams
    before: np.ndarray
    after: np.ndarray

    @property
    def support(self) -> list[int]:
        return smp.support(self.after)

    @property
    def kept_mass(self) -> float:
        return float(self.before[self.support].sum())


def pipeline_view(
    logits: Sequence[float] | np.ndarray,
    params: smp.SamplingParams,
    prompt_ids: Sequence[int] = (),
    output_ids: Sequence[int] = (),
) -> DistributionView:
    """Run the course pipeline on ``logits`` and keep both ends of the truncation stage."""
    shaped = smp.apply_penalties(smp.apply_hard_constraints(logits, params, output_ids), params,
                                 prompt_ids, output_ids)
    before = smp.softmax(shaped) if params.temperature == 0 else smp.temperature_probs(
        shaped, params.temperature)
    after = smp.next_token_distribution(logits, params, prompt_ids, output_ids)
    return DistributionView(params, before, after)


def _check_labels(labels: Sequence[str], size: int) -> list[str]:
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise TypeError("labels must be a sequence of str, one per vocabulary entry")
    if len(labels) != size:
        raise ValueError(f"labels must name every token: expected {size}, got {len(labels)}")
    return [str(label) for label in labels]


def _shown_ids(logits: np.ndarray, show_top: int | None) -> np.ndarray:
    """Ids to draw: all of them, or the ``show_top`` highest logits (ties: smaller id first)."""
    if show_top is None:
        return np.arange(logits.size)
    if isinstance(show_top, bool) or not isinstance(show_top, int) or show_top < 1:
        raise ValueError(f"show_top must be None or an int >= 1, got {show_top!r}")
    return np.argsort(-logits, kind="stable")[:show_top]


def _view_caption(view: DistributionView, labels: list[str], max_named: int = 8) -> str:
    """Two lines: "support: n tokens · mass kept 0.873", then the most probable of them, quoted
    (so "?" or "," reads as a token), most probable first."""
    kept = sorted(view.support, key=lambda i: (-view.after[i], i))
    names = ", ".join(f"“{labels[i]}”" for i in kept[:max_named]) + (
        " …" if len(kept) > max_named else ""
    )
    noun = "token" if len(kept) == 1 else "tokens"
    return f"support ({len(kept)} {noun}) · mass kept {view.kept_mass:.3f}<br>{{{names}}}"


def _bar_traces(view: DistributionView, shown: np.ndarray, labels: list[str]) -> list[go.Bar]:
    kept = set(view.support)
    x = [labels[i] for i in shown]
    colours = [KEPT_COLOR if int(i) in kept else CUT_COLOR for i in shown]
    return [
        go.Bar(x=x, y=view.before[shown], name="seen by the filters", marker_color=colours,
               hovertemplate="%{x}: %{y:.4f}<extra>before truncation</extra>"),
        go.Bar(x=x, y=view.after[shown], name="sampled from", marker_color=FINAL_COLOR,
               hovertemplate="%{x}: %{y:.4f}<extra>after truncation</extra>"),
    ]


def _headroom(views: Sequence[DistributionView], shown: np.ndarray) -> float:
    """A y-axis top that fits every drawn bar of every view, with a little space above (<= 1.05)."""
    tallest = max(float(max(v.before[shown].max(), v.after[shown].max())) for v in views)
    return min(1.05, 1.15 * tallest)


def _distribution_layout(fig: go.Figure, title: str, y_top: float) -> go.Figure:
    fig.update_layout(
        title=title,
        barmode="group",
        yaxis_title="probability",
        yaxis_range=[0, y_top],
        xaxis_title="token",
        margin={"t": 90, "b": 40},
        legend={"x": 0.99, "y": 0.99, "xanchor": "right", "yanchor": "top"},
    )
    return fig


def distribution_figure(logits: Sequence[float] | np.ndarray, labels: Sequence[str],
                        params: smp.SamplingParams, *, prompt_ids: Sequence[int] = (),
                        output_ids: Sequence[int] = (), show_top: int | None = None,
                        y_top: float | None = None) -> go.Figure:
    """Bars of one decode step: grey = cut by a filter, blue = kept (before), orange = final.

    ``show_top`` limits the drawing to that many highest-logit tokens (large vocabularies); the
    support and mass in the title always cover the whole vocabulary. ``y_top`` fixes the top of the
    probability axis (default: just above the tallest bar).
    """
    z = np.asarray(logits, dtype=float)
    names = _check_labels(labels, z.size)
    view = pipeline_view(z, params, prompt_ids, output_ids)
    shown = _shown_ids(z, show_top)
    fig = go.Figure(_bar_traces(view, shown, names))
    return _distribution_layout(fig, _view_caption(view, names), y_top or _headroom([view], shown))


def _sweep_params(
    base: smp.SamplingParams, param: str, values: Sequence[float]
) -> list[smp.SamplingParams]:
    if param not in SWEEPABLE:
        raise ValueError(f"param must be one of {SWEEPABLE}, got {param!r}")
    if isinstance(values, str) or not isinstance(values, Sequence) or len(values) < 2:
        raise ValueError("values must be a sequence of at least two settings to slide over")
    return [dataclasses.replace(base, **{param: value}) for value in values]


def distribution_slider_figure(
    logits: Sequence[float] | np.ndarray,
    labels: Sequence[str],
    *,
    param: str,
    values: Sequence[float],
    base: smp.SamplingParams | None = None,
    prompt_ids: Sequence[int] = (),
    output_ids: Sequence[int] = (),
    show_top: int | None = None,
    active: int = 0,
) -> go.Figure:
    """A slider over one SamplingParams field; every frame is a :func:`distribution_figure` computed
    now.

    ``param`` names the field (see :data:`SWEEPABLE`), ``values`` its settings, ``base`` the other
    fields (default: all filters off, ``T = 1``), ``active`` the index shown first. Each frame's
    title states the exact support and the mass it keeps, so the static page needs no kernel.
    """
    base = base or smp.SamplingParams()
    settings = dict(zip(values, _sweep_params(base, param, values)))
    z = np.asarray(logits, dtype=float)
    views = [pipeline_view(z, p, prompt_ids, output_ids) for p in settings.values()]
    y_top = _headroom(views, _shown_ids(z, show_top))  # one axis for every frame
    return slider_figure(
        lambda value: distribution_figure(z, labels, settings[value], prompt_ids=prompt_ids,
                                          output_ids=output_ids, show_top=show_top, y_top=y_top),
        list(values), label=param, active=active, value_text=lambda value: f"{value:g}")


def support_size_figure(logits: Sequence[float] | np.ndarray, temperatures: Sequence[float],
                        settings: Mapping[str, smp.SamplingParams]) -> go.Figure:
    """Support size against temperature, one line per named filter setting.

    Each setting's temperature is replaced by every value of ``temperatures`` (all > 0); the support
    is counted over the whole vocabulary. Top-k lines stay flat, top-p and min-p ones grow with T.
    """
    if not settings:
        raise ValueError("settings must name at least one SamplingParams")
    temps = [float(t) for t in temperatures]
    if len(temps) < 2 or min(temps) <= 0:
        raise ValueError("temperatures must hold at least two values, all > 0")
    fig = go.Figure()
    for name, params in settings.items():
        sizes = [len(smp.support(smp.next_token_distribution(
            logits, dataclasses.replace(params, temperature=t)))) for t in temps]
        fig.add_trace(go.Scatter(x=temps, y=sizes, mode="lines+markers", name=name))
    fig.update_layout(xaxis_title="temperature T", yaxis_title="tokens in the support",
                      xaxis_type="log", yaxis_type="log", legend_orientation="h", legend_y=-0.25)
    return fig


def logit_comparison_figure(labels: Sequence[str], series: Mapping[str, Sequence[float]], *,
                            highlight: Sequence[int] = ()) -> go.Figure:
    """Grouped bars of several logit vectors over the same tokens (e.g. before and after a penalty).

    ``highlight`` lists token ids to mark with ``*`` in the axis labels (e.g. the tokens already
    seen).
    """
    if not series:
        raise ValueError("series must hold at least one named logit vector")
    names = list(labels)
    marked = set(highlight)
    x = [f"{label}*" if i in marked else label for i, label in enumerate(names)]
    fig = go.Figure()
    for name, values in series.items():
        y = np.asarray(values, dtype=float)
        if y.shape != (len(names),):
            raise ValueError(
                f"series {name!r} must have one value per label ({len(names)}), got {y.shape}"
            )
        fig.add_trace(go.Bar(x=x, y=y, name=name))
    fig.update_layout(barmode="group", yaxis_title="logit", xaxis_title="token (* = already seen)",
                      legend_orientation="h", legend_y=-0.25)
    return fig


# --------------------------------------------------------------------------------------------------
# Live controls (ipywidgets): a live kernel gets sliders, the static book a precomputed twin
# --------------------------------------------------------------------------------------------------

CONTROL_CHOICES: dict[str, tuple[float, ...]] = {
    "temperature": (0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0),
    "top_k": (0, 1, 2, 3, 5, 10, 20, 50),
    "top_p": (0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0),
    "min_p": (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0),
    "repetition_penalty": (0.8, 1.0, 1.2, 1.5, 2.0),
    "frequency_penalty": (-1.0, 0.0, 0.5, 1.0, 2.0),
    "presence_penalty": (-1.0, 0.0, 0.5, 1.0, 2.0),
}
"""The settings each live slider offers (``top_k = 0`` means off); defaults are SamplingParams'."""


STATIC_CONTROLS = ("top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")
"""The live controls that get a precomputed slider figure of their own besides temperature and
top-p."""


def _static_choices(name: str, vocab_size: int) -> tuple[list[float], int]:
    """The slider values for one control (top-k: only k that truncate or just stop doing so) and the
    index of the setting that leaves the distribution alone, where the slider starts."""
    if name == "top_k":
        values = [k for k in CONTROL_CHOICES["top_k"] if 0 < k < vocab_size] + [vocab_size]
        return values, len(values) - 1
    values = list(CONTROL_CHOICES[name])
    return values, values.index(getattr(smp.SamplingParams(), name))


def control_slider_figures(logits: Sequence[float] | np.ndarray, labels: Sequence[str], *,
                           base: smp.SamplingParams | None = None, prompt_ids: Sequence[int] = (),
                           output_ids: Sequence[int] = (), show_top: int | None = None,
                           controls: Sequence[str] = STATIC_CONTROLS) -> dict[str, go.Figure]:
    """One :func:`distribution_slider_figure` per control, so the static book has every live slider.

    Each slider offers the live control's choices (:data:`CONTROL_CHOICES`) and starts where the
    control is off (top-k at the whole vocabulary, min-p 0, penalties neutral). The penalties act on
    ``output_ids`` (frequency, presence) and on ``prompt_ids`` plus ``output_ids`` (repetition).
    """
    size = np.asarray(logits).size
    figures = {}
    for name in controls:
        values, active = _static_choices(name, size)
        figures[name] = distribution_slider_figure(
            logits, labels, param=name, values=values, base=base, prompt_ids=prompt_ids,
            output_ids=output_ids, show_top=show_top, active=active)
    return figures


def _params_from_controls(top_k: int = 0, **values: float) -> smp.SamplingParams:
    """SamplingParams from slider values, mapping the slider's ``top_k = 0`` to "disabled"."""
    return smp.SamplingParams(top_k=top_k or None, **values)


def sampling_controls(logits: Sequence[float] | np.ndarray, labels: Sequence[str], *,
                      prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = (),
                      show_top: int | None = None, sweep: str = "temperature") -> LiveControls:
    """Sliders for temperature, top-k, top-p, min-p and the three penalties over one logit vector.

    In a kernel every change redraws :func:`distribution_figure` (the exact support and its mass,
    computed by ``servelab.sampling``); the static book shows the twin, a slider over ``sweep``.
    Display the returned object as a cell's last expression.
    """
    z = np.asarray(logits, dtype=float)
    names = _check_labels(labels, z.size)

    def draw(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
             repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
             presence_penalty: float = 0.0) -> go.Figure:
        params = _params_from_controls(
            top_k, temperature=temperature, top_p=top_p, min_p=min_p,
            repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty)
        return distribution_figure(z, names, params, prompt_ids=prompt_ids, output_ids=output_ids,
                                   show_top=show_top)

    return live_controls(draw, sweep=sweep, **CONTROL_CHOICES)


def generation_controls(generate: Callable[[smp.SamplingParams], str], *,
                        max_tokens: int = 40) -> ipywidgets.VBox:
    """The same sliders plus a seed and a button that prints ``generate(params)``.

    ``generate`` is supplied by the caller (e.g. a decoding loop over the tiny model), so the
    control works with any model. Returns an ``ipywidgets.VBox``; it needs a kernel, so tag its cell
    ``remove-output`` (text generation has no static twin).
    """
    import ipywidgets as w

    if not callable(generate):
        raise TypeError("generate must be callable: SamplingParams -> str")
    defaults = smp.SamplingParams()
    sliders = {
        name: selection_slider(name, options, 0 if name == "top_k" else getattr(defaults, name))
        for name, options in CONTROL_CHOICES.items()
    }
    seed = w.IntText(0, description="seed")
    button = w.Button(description="generate")
    out = w.Output()

    def run(_button: object = None) -> None:
        values = {name: slider.value for name, slider in sliders.items()}
        params = _params_from_controls(**values, seed=seed.value, max_tokens=max_tokens)
        out.clear_output(wait=True)
        with out:
            print(generate(params))

    button.on_click(run)
    return w.VBox([*sliders.values(), seed, button, out])
