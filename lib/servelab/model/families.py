"""Checkpoint families: which ``config.json`` files the one course model runs, and how each maps
onto it.

Every supported family is Llama-shaped (RMSNorm, RoPE, grouped-query attention, SwiGLU); they differ
by a few named switches of :class:`~servelab.model.llama.LlamaConfig`:

============  ==========================  ===========================================================
model_type    examples                    difference from plain Llama
============  ==========================  ===========================================================
``llama``     Llama 1-3.x, SmolLM2        RoPE ``default``, ``linear`` or ``llama3`` (``rope_scaling``)
``mistral``   Mistral 7B v0.2+            none, when ``sliding_window`` is null
``qwen2``     Qwen2, Qwen2.5              biases on q, k and v (``qkv_bias``)
``qwen3``     Qwen3 (dense)               RMSNorm on each q and k head (``qk_norm``); 128-dim heads
============  ==========================  ===========================================================

Absent keys take the default ``transformers`` uses for that ``model_type`` (:data:`DEFAULTS`): a
Llama config without ``tie_word_embeddings`` is *untied*, a Qwen3 one without ``head_dim`` has
128-dim heads.

System boundary: a parsed ``config.json`` dict in, a validated :class:`LlamaConfig` out. Anything
the model does not compute (sliding windows, other RoPE types, MLP biases, other architectures) is
refused with a ValueError naming the key and what is supported, never loaded into a model that
decodes wrongly.
"""

from __future__ import annotations

from servelab.model.llama import LlamaConfig

__all__ = ["DEFAULTS", "FAMILIES", "ROPE_TYPES", "config_from_hf"]

_COMMON = {
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
}
DEFAULTS: dict[str, dict] = {
    "llama": _COMMON | {"max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2},
    "mistral": _COMMON | {"max_position_embeddings": 131072, "bos_token_id": 1, "eos_token_id": 2,
                          "sliding_window": 4096},
    "qwen2": _COMMON | {"max_position_embeddings": 32768},
    "qwen3": _COMMON | {"max_position_embeddings": 32768, "head_dim": 128},
}
"""transformers' defaults (``LlamaConfig()``, ``MistralConfig()`` ... in transformers 5.24) for keys
a ``config.json`` may leave out."""
FAMILIES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
"""Supported ``model_type`` -> its transformers architecture."""
ROPE_TYPES = ("default", "linear", "llama3")
REQUIRED_CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads")
_ROPE_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def config_from_hf(cfg: dict) -> LlamaConfig:
    """Validate a parsed HF ``config.json`` of a supported family (see the module docstring) and
    convert it.

    Raises:
        TypeError: ``cfg`` is not a dict.
        ValueError: an unsupported family or feature, naming the key and what is supported.
    """
    if not isinstance(cfg, dict):
        raise TypeError(f"config must be a dict, got {type(cfg).__name__}")
    family = cfg.get("model_type")
    if family not in FAMILIES:
        raise ValueError(
            f"config model_type {family!r} is not supported (supported: {', '.join(FAMILIES)})"
        )
    architectures = cfg.get("architectures") or [FAMILIES[family]]
    if FAMILIES[family] not in architectures:
        raise ValueError(
            f"config architectures must include {FAMILIES[family]!r} for model_type {family!r}, "
            f"got {architectures!r}"
        )
    full = DEFAULTS[family] | {
        k: v for k, v in cfg.items() if v is not None or k == "sliding_window"
    }
    missing = [k for k in REQUIRED_CONFIG_KEYS if full.get(k) is None]
    if missing:
        raise ValueError(f"config is missing required keys: {', '.join(missing)}")
    _check_supported(full, family)
    theta, scaling = _rope(full)
    return LlamaConfig.from_hf_dict(full | {
        "num_key_value_heads": full.get("num_key_value_heads") or full["num_attention_heads"],
        "rope_theta": theta, "rope_scaling": scaling, "model_type": family,
        "qkv_bias": family == "qwen2", "qk_norm": family == "qwen3"})


def _check_supported(cfg: dict, family: str) -> None:
    """Refuse what the course model does not compute."""
    if cfg.get("hidden_act") != "silu":
        raise ValueError(f"config hidden_act must be 'silu' (SwiGLU), got {cfg['hidden_act']!r}")
    if family in ("llama", "mistral", "qwen3"):
        for key in ("attention_bias", "mlp_bias"):
            if cfg.get(key):
                raise ValueError(
                    f"config {key} is true: biases are supported only on Qwen2's q/k/v "
                    f"projections (model_type 'qwen2'), not on a {family!r} model"
                )
    window = (
        cfg.get("sliding_window") if family == "mistral" or cfg.get("use_sliding_window") else None
    )
    if window is not None:
        raise ValueError(
            f"config sliding_window is {window}: sliding-window attention is not supported "
            "(supported: full causal attention, i.e. sliding_window null / "
            "use_sliding_window false)"
        )
    if any(t != "full_attention" for t in cfg.get("layer_types") or ()):
        raise ValueError(
            "config layer_types lists non-full attention layers: only full attention is supported"
        )


def _rope(cfg: dict) -> tuple[float, dict | None]:
    """``(rope_theta, rope_scaling or None)`` from the classic keys or transformers 5's
    ``rope_parameters``."""
    params = dict(cfg.get("rope_parameters") or {})
    params.update(cfg.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", cfg.get("rope_theta")))
    kind = params.pop("rope_type", params.pop("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"config RoPE type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
        )
    if kind == "default":
        return theta, None
    missing = [k for k in _ROPE_KEYS[kind] if k not in params]
    if (
        kind == "llama3"
        and "original_max_position_embeddings" in missing
        and cfg.get("max_position_embeddings")
    ):
        params["original_max_position_embeddings"] = cfg["max_position_embeddings"]
        missing.remove("original_max_position_embeddings")
    if missing:
        raise ValueError(f"config RoPE type {kind!r} needs {', '.join(missing)}")
    return theta, {"rope_type": kind} | {k: params[k] for k in _ROPE_KEYS[kind]}
