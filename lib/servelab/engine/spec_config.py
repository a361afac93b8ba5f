"""``EngineConfig.speculative_config``: which proposer drafts tokens for the engine to verify, with
vLLM's keys.

Two methods, spelled as vLLM's ``--speculative-config`` JSON spells them:

* ``{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": n, "prompt_lookup_min":
  m}``: prompt lookup, no second model (vLLM's defaults: both bounds 5 when neither is given, one
  given sets the other);
* ``{"method": "draft_model", "model": <checkpoint folder>, "num_speculative_tokens": k}``: a
  smaller model that shares the target's tokenizer (``"model": None`` is the shipped tiny draft
  model, which shares the shipped target's tokenizer; a :class:`~servelab.model.LlamaForCausalLM`
  object is accepted too, for tests and notebooks).

System boundary: plain values only; the draft checkpoint is loaded, and its vocabulary checked
against the target's, by :mod:`~servelab.engine.spec_propose` when the engine is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servelab._validate import require_int

SPEC_METHODS = ("ngram", "draft_model")
_KEYS = {"ngram": ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"),
         "draft_model": ("method", "num_speculative_tokens", "model")}
NGRAM_DEFAULT = 5  # vLLM's prompt_lookup_min / _max when neither is given


@dataclass(frozen=True)
class SpeculativeConfig:
    """A validated speculative-decoding setting (build it with :func:`speculative_config`).

    Attributes:
        method: ``"ngram"`` or ``"draft_model"``.
        num_speculative_tokens: ``k``, the most tokens proposed per request per step (>= 1); a
            verify row of a decoding request is ``k + 1`` tokens.
        prompt_lookup_max / prompt_lookup_min: n-gram lengths tried, longest first (``ngram`` only).
        model: the draft checkpoint folder, None for the shipped tiny draft model, or a model object
            (``draft_model`` only).
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    model: object = None


def speculative_config(value: SpeculativeConfig | Mapping | None) -> SpeculativeConfig | None:
    """``value`` (a dict with vLLM's keys, a :class:`SpeculativeConfig`, or None: no speculation)
    checked and completed. ValueError naming the key and what is allowed for any bad entry."""
    if value is None or isinstance(value, SpeculativeConfig):
        return value if value is None else speculative_config(vars(value) | {"model": value.model})
    if not isinstance(value, Mapping):
        raise TypeError(
            f"speculative_config must be a dict with vLLM's keys or None, got "
            f"{type(value).__name__}"
        )
    method = value.get("method")
    if method not in SPEC_METHODS:
        raise ValueError(
            f"speculative_config['method'] must be one of {SPEC_METHODS}, got {method!r}"
        )
    unknown = [key for key, v in value.items() if key not in _KEYS[method] and v is not None]
    if unknown:
        raise ValueError(
            f"speculative_config keys for method {method!r} are {_KEYS[method]}, got {unknown}"
        )
    if "num_speculative_tokens" not in value:
        raise ValueError(
            "speculative_config['num_speculative_tokens'] (k, tokens proposed per step) is required"
        )
    k = _positive("num_speculative_tokens", value["num_speculative_tokens"])
    if method == "draft_model":
        model = value.get("model")
        if isinstance(model, Path):
            model = str(model)
        if (
            model is not None
            and not isinstance(model, str)
            and type(model).__name__ != "LlamaForCausalLM"
        ):
            raise ValueError(
                "speculative_config['model'] must be a checkpoint folder, None (the shipped "
                f"tiny draft model) or a LlamaForCausalLM, got {type(model).__name__}"
            )
        return SpeculativeConfig(method, k, model=model)
    high, low = value.get("prompt_lookup_max"), value.get("prompt_lookup_min")
    if high is None and low is None:
        high = low = NGRAM_DEFAULT
    high = _positive("prompt_lookup_max", low if high is None else high)
    low = _positive("prompt_lookup_min", high if low is None else low)
    if low > high:
        raise ValueError(
            f"speculative_config['prompt_lookup_min'] must be <= prompt_lookup_max ({high}), "
            f"got {low}"
        )
    return SpeculativeConfig(method, k, prompt_lookup_max=high, prompt_lookup_min=low)


def _positive(key: str, value: object) -> int:
    """An int >= 1 for ``speculative_config[key]``; a wrong type is a bad value of the key too."""
    try:
        return require_int(f"speculative_config[{key!r}]", value, 1)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
