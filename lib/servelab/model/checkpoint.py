"""Saving and loading Llama checkpoints in the Hugging Face folder layout.

A checkpoint folder holds ``config.json`` (HF keys; a family of :mod:`servelab.model.families`) and
``model.safetensors`` (HF tensor names), or shards listed by ``model.safetensors.index.json``. With
tied embeddings the file stores only ``model.embed_tokens.weight``, as ``transformers`` does;
``lm_head.weight`` is the same tensor. Folders written here load in
``transformers.LlamaForCausalLM``, and Llama-family folders from the Hub (e.g. SmolLM2-135M) load
here.

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
from servelab.model.families import config_from_hf
from servelab.model.llama import LlamaConfig, LlamaForCausalLM, pack_hf_state, unpack_to_hf_state

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
GENERATION_CONFIG_FILE = "generation_config.json"
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
    """Write ``config.json`` and ``model.safetensors`` (in the model's current dtype) to
    ``directory``."""
    if not isinstance(model, LlamaForCausalLM):
        raise TypeError(f"model must be a LlamaForCausalLM, got {type(model).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # HF's separate q/k/v, gate/up tensors
    hf_state = unpack_to_hf_state(model.state_dict(), model.config)
    state = {name: t.detach().to("cpu").contiguous() for name, t in hf_state.items()}
    if model.config.tie_word_embeddings:
        # the same storage as the embedding; transformers re-ties on load
        del state["lm_head.weight"]
    dtype = next(iter(state.values())).dtype
    config = model.config.to_hf_dict() | {"torch_dtype": str(dtype).removeprefix("torch.")}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    return directory


def llama_config_from_hf(cfg: dict) -> LlamaConfig:
    """Validate a parsed HF ``config.json`` of a supported family and convert it; see
    :func:`servelab.model.families.config_from_hf`."""
    return config_from_hf(cfg)


def eos_token_ids(directory: Path, cfg: LlamaConfig) -> tuple[int, ...]:
    """Every EOS id of ``config.json`` and ``generation_config.json`` (config's first, in order, no
    repeats): a Llama 3 Instruct turn ends with ``<|eot_id|>``, which only one of the two files may
    list."""
    ids = list(cfg.eos_token_ids)
    generation = directory / GENERATION_CONFIG_FILE
    if generation.is_file():
        extra = json.loads(generation.read_text()).get("eos_token_id")
        for token in extra if isinstance(extra, list) else [] if extra is None else [extra]:
            if not isinstance(token, int) or isinstance(token, bool):
                raise ValueError(
                    f"{generation}: eos_token_id must be an int or a list of ints, got {extra!r}"
                )
            if token not in ids:
                ids.append(token)
    return tuple(ids)


def load_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors``, or of the shards ``model.safetensors.index.json``
    lists."""
    if (directory / WEIGHTS_FILE).is_file():
        return load_file(str(directory / WEIGHTS_FILE), device="cpu")
    if not (directory / INDEX_FILE).is_file():
        raise ValueError(f"directory {directory} has neither {WEIGHTS_FILE} nor {INDEX_FILE} "
                         "(only safetensors is read, never pickled .bin files)")
    weight_map = json.loads((directory / INDEX_FILE).read_text()).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(
            f"{directory / INDEX_FILE} has no 'weight_map' of tensor name -> shard file"
        )
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if Path(shard).name != shard or not (directory / shard).is_file():
            raise ValueError(
                f"{directory / INDEX_FILE} lists shard {shard!r}, which is not a file in "
                f"{directory}"
            )
        state.update(load_file(str(directory / shard), device="cpu"))
    return state


def check_state_dict(state: dict[str, torch.Tensor], cfg: LlamaConfig) -> None:
    """Raise ValueError naming every missing, unexpected or misshaped tensor of a Hugging Face Llama
    state dict (HF tensor names) for ``cfg``."""
    with torch.device("meta"):
        hf_names = unpack_to_hf_state(LlamaForCausalLM(cfg).state_dict(), cfg)
    expected = {k: tuple(v.shape) for k, v in hf_names.items()}
    optional = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    missing = sorted(set(expected) - set(state) - optional)
    unexpected = sorted(set(state) - set(expected))
    misshaped = [
        f"{k} {tuple(state[k].shape)} (expected {expected[k]})"
        for k in sorted(set(state) & set(expected))
        if tuple(state[k].shape) != expected[k]
    ]
    problems = [f"{label}: {', '.join(items)}" for label, items in
                (("missing tensors", missing), ("unexpected tensors", unexpected),
                 ("wrong shapes", misshaped)) if items]
    if problems:
        raise ValueError("state dict does not fit the Llama config; " + "; ".join(problems))


def load_checkpoint(directory: str | Path | None = None, device: str | torch.device | None = None,
                    dtype: str | torch.dtype | None = None) -> LlamaForCausalLM:
    """Load a Llama-family HF folder (``config.json`` + ``model.safetensors``) in eval mode.

    Defaults: the shipped Shakespeare model; device and dtype from
    :func:`servelab.device.pick_device` (bf16 on CUDA, else fp32 on the CPU). Weights stored in
    another dtype are converted to ``dtype``.
    """
    directory = Path(default_model_dir() if directory is None else directory)
    device, dtype = pick_device(device, dtype)
    if not (directory / CONFIG_FILE).is_file():
        raise ValueError(f"directory {directory} has no {CONFIG_FILE}")
    cfg = llama_config_from_hf(json.loads((directory / CONFIG_FILE).read_text()))
    eos = eos_token_ids(directory, cfg)
    # one id stays an int, as in config.json
    cfg.eos_token_id = eos[0] if len(eos) == 1 else list(eos)
    state = load_weights(directory)
    # some tied checkpoints store the head too; the embedding is the one used
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    check_state_dict(state, cfg)
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(pack_hf_state({k: v.float() for k, v in state.items()}, cfg),
                          strict=not cfg.tie_word_embeddings)
    return model.to(device=device, dtype=dtype).eval()
