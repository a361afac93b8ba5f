"""KV bytes beyond the uniform formula: MLA latents, sliding-window and hybrid layer stacks, and the
seconds a KV transfer takes over a link.

``kv_bytes_per_token`` (``2 * n_layer * n_kv_head * d_head * b``) holds for a model whose every
layer is full attention with separate K and V heads (MHA, GQA, MQA). Three layouts break it:

* **MLA** (DeepSeek-V2/V3): each layer caches one compressed latent of ``kv_lora_rank`` elements
  plus a shared RoPE key of ``rope_head_dim`` elements, not K and V per head
  (:func:`mla_kv_bytes_per_token`).
* **Sliding-window layers** keep at most ``window`` tokens, so their share stops growing with the
  context; a stack that mixes them with full-attention layers (gpt-oss, Gemma 3) grows only through
  its full layers (:func:`sequence_kv_bytes`).
* **Linear-attention or Mamba layers** keep a constant-size state per sequence, whatever its length
  (not modelled here: their bytes do not depend on the context at all).

:func:`kv_transfer_seconds` is the time one sequence's KV takes across a link, the cost that
prefill/decode disaggregation adds. Ideal payload only: block rounding, metadata and quantization
scales are left out. Plain numbers in and out; units are bytes, tokens, seconds. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable

from servelab._validate import require_index, require_real

__all__ = ["mla_kv_bytes_per_token", "sequence_kv_bytes", "kv_transfer_seconds"]


def mla_kv_bytes_per_token(n_layer: int, kv_lora_rank: int, rope_head_dim: int,
                           bytes_per_elem: int) -> int:
    """Bytes one token costs in an MLA cache:
    ``n_layer * (kv_lora_rank + rope_head_dim) * bytes_per_elem``.

    MLA caches one latent vector per layer and token (K and V are re-expanded from it inside the
    kernel), so there is no factor 2 and no head count. DeepSeek-V3 (61 layers, rank 512, RoPE
    dim 64) stores 576 elements per layer.

    >>> mla_kv_bytes_per_token(61, 512, 64, 2)
    70272
    """
    n_layer = require_index("n_layer", n_layer, 1)
    kv_lora_rank = require_index("kv_lora_rank", kv_lora_rank, 1)
    rope_head_dim = require_index("rope_head_dim", rope_head_dim, 0)
    bytes_per_elem = require_index("bytes_per_elem", bytes_per_elem, 1)
    return n_layer * (kv_lora_rank + rope_head_dim) * bytes_per_elem


def sequence_kv_bytes(context_tokens: int, layer_windows: Iterable[int | None], n_kv_head: int,
                      d_head: int, bytes_per_elem: int) -> int:
    """Bytes of K and V one sequence of ``context_tokens`` holds in a stack of attention layers.

    ``layer_windows`` has one entry per layer: ``None`` for full attention (holds every token), or
    the sliding window in tokens (holds at most that many). With every entry ``None`` this is
    ``context_tokens * kv_bytes_per_token``.

    >>> sequence_kv_bytes(1000, [None, 128], 8, 64, 2)
    2310144
    """
    context = require_index("context_tokens", context_tokens, 0)
    windows = list(layer_windows)
    if not windows:
        raise ValueError("layer_windows must list at least one layer "
                         "(None = full attention, or a window)")
    held = 0
    for i, window in enumerate(windows):
        if window is None:
            held += context
        else:
            held += min(context, require_index(f"layer_windows[{i}]", window, 1))
    n_kv_head = require_index("n_kv_head", n_kv_head, 1)
    d_head = require_index("d_head", d_head, 1)
    bytes_per_elem = require_index("bytes_per_elem", bytes_per_elem, 1)
    return 2 * held * n_kv_head * d_head * bytes_per_elem


def kv_transfer_seconds(tokens: int, bytes_per_token: float, link_bytes_per_s: float) -> float:
    """Seconds to move ``tokens`` tokens of KV (``bytes_per_token`` each) over a link of
    ``link_bytes_per_s``, bandwidth only: no latency, no overlap with compute, no per-layer
    pipelining.

    >>> kv_transfer_seconds(1000, 1000, 1e6)
    1.0
    """
    tokens = require_index("tokens", tokens, 0)
    per_token = require_real("bytes_per_token", bytes_per_token, 0)
    link = require_real("link_bytes_per_s", link_bytes_per_s, 0, strict_min=True)
    return tokens * per_token / link
