"""Saving and loading Llama checkpoints in the Hugging Face folder layout.

A checkpoint folder holds ``config.json`` (HF keys, ``model_type: "llama"``) and ``model.safetensors``
(HF tensor names). With tied embeddings the file stores only ``model.embed_tokens.weight``, as
``transformers`` does; ``lm_head.weight`` is the same tensor. Folders written here load in
``transformers.LlamaForCausalLM``, and Llama-family folders from the Hub (e.g. SmolLM2-135M) load here.

System boundary: files on disk in, an eval-mode :class:`LlamaForCausalLM` on one device out. Only
safetensors is read (never pickle). Anything that is not Llama-shaped is rejected with a ValueError
that names the offending key or tensor, rather than loaded into a model that computes nonsense.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from servelab.device import pick_device
from servelab.model.llama import LlamaConfig, LlamaForCausalLM, pack_hf_state, unpack_to_hf_state

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
REQUIRED_CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size",
                        "num_hidden_layers", "num_attention_heads")
_ASSETS = Path(__file__).resolve().parent.parent / "assets"


def default_model_dir() -> Path:
    """The shipped target model: ``servelab/assets/shakespeare``."""
    return _ASSETS / "shakespeare"


def draft_model_dir() -> Path:
    """The shipped draft model for speculative decoding: ``servelab/assets/shakespeare-draft``.

    It shares the target's tokenizer (load that from :func:`default_model_dir`).
    """
    return _ASSETS / "shakespeare-draft"


def save_checkpoint(model: LlamaForCausalLM, directory: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (in the model's current dtype) to ``directory``."""
    if not isinstance(model, LlamaForCausalLM):
        raise TypeError(f"model must be a LlamaForCausalLM, got {type(model).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_state = unpack_to_hf_state(model.state_dict(), model.config)  # HF's separate q/k/v, gate/up tensors
    state = {name: t.detach().to("cpu").contiguous() for name, t in hf_state.items()}
    if model.config.tie_word_embeddings:
        del state["lm_head.weight"]  # the same storage as the embedding; transformers re-ties on load
    dtype = next(iter(state.values())).dtype
    config = model.config.to_hf_dict() | {"torch_dtype": str(dtype).removeprefix("torch.")}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    return directory


def llama_config_from_hf(cfg: dict) -> LlamaConfig:
    """Validate a parsed HF ``config.json`` as a plain Llama and convert it.

    Rejects other architectures, missing size keys, biases, non-SiLU activations and RoPE scaling,
    none of which :class:`LlamaForCausalLM` implements.
    """
    if not isinstance(cfg, dict):
        raise TypeError(f"config must be a dict, got {type(cfg).__name__}")
    if cfg.get("model_type") != "llama":
        raise ValueError(f"config model_type must be 'llama', got {cfg.get('model_type')!r}")
    architectures = cfg.get("architectures") or ["LlamaForCausalLM"]
    if "LlamaForCausalLM" not in architectures:
        raise ValueError(f"config architectures must include 'LlamaForCausalLM', got {architectures!r}")
    missing = [k for k in REQUIRED_CONFIG_KEYS if cfg.get(k) is None]
    if missing:
        raise ValueError(f"config is missing required keys: {', '.join(missing)}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config hidden_act must be 'silu', got {cfg['hidden_act']!r}")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise ValueError(f"config {key} must be false: this model has no biases")
    return LlamaConfig.from_hf_dict(cfg | _rope_settings(cfg) | {
        "num_key_value_heads": cfg.get("num_key_value_heads") or cfg["num_attention_heads"]})


def _rope_settings(cfg: dict) -> dict:
    """``rope_theta`` from either the classic top-level key or transformers 5's ``rope_parameters``."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    for source, name in ((params, "rope_parameters"), (scaling, "rope_scaling")):
        rope_type = source.get("rope_type", source.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"config {name} has rope_type {rope_type!r}; only 'default' RoPE is supported")
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    return {} if theta is None else {"rope_theta": float(theta)}


def check_state_dict(state: dict[str, torch.Tensor], cfg: LlamaConfig) -> None:
    """Raise ValueError naming every missing, unexpected or misshaped tensor of a Hugging Face Llama
    state dict (HF tensor names) for ``cfg``."""
    with torch.device("meta"):
        hf_names = unpack_to_hf_state(LlamaForCausalLM(cfg).state_dict(), cfg)
    expected = {k: tuple(v.shape) for k, v in hf_names.items()}
    optional = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    missing = sorted(set(expected) - set(state) - optional)
    unexpected = sorted(set(state) - set(expected))
    misshaped = [f"{k} {tuple(state[k].shape)} (expected {expected[k]})"
                 for k in sorted(set(state) & set(expected)) if tuple(state[k].shape) != expected[k]]
    problems = [f"{label}: {', '.join(items)}" for label, items in
                (("missing tensors", missing), ("unexpected tensors", unexpected),
                 ("wrong shapes", misshaped)) if items]
    if problems:
        raise ValueError("state dict does not fit the Llama config; " + "; ".join(problems))


def load_checkpoint(directory: str | Path | None = None, device: str | torch.device | None = None,
                    dtype: str | torch.dtype | None = None) -> LlamaForCausalLM:
    """Load a Llama-family HF folder (``config.json`` + ``model.safetensors``) in eval mode.

    Defaults: the shipped Shakespeare model; device and dtype from :func:`servelab.device.pick_device`
    (bf16 on CUDA, else fp32 on the CPU). Weights stored in another dtype are converted to ``dtype``.
    """
    directory = Path(default_model_dir() if directory is None else directory)
    device, dtype = pick_device(device, dtype)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise ValueError(f"directory {directory} has no {name} (only single-file safetensors is read)")
    cfg = llama_config_from_hf(json.loads((directory / CONFIG_FILE).read_text()))
    state = load_file(str(directory / WEIGHTS_FILE), device="cpu")
    check_state_dict(state, cfg)
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(pack_hf_state({k: v.float() for k, v in state.items()}, cfg),
                          strict=not cfg.tie_word_embeddings)
    return model.to(device=device, dtype=dtype).eval()
