"""An FP8 (e4m3) KV cache: its bytes, and the logit error of storing K and V in it.

An FP8 KV cache stores each K and V element in one byte (``torch.float8_e4m3fn``: 4 exponent bits,
3 mantissa bits, largest finite value 448) with one scale per tensor, and attention reads it back
multiplied by that scale. The bytes per token halve against bf16, so attention, which reads the
whole cache every decode step, reads half the bytes. The rounding is the price:
:func:`kv_fp8_logit_error` measures it on a real model by running the same tokens once with exact
K/V and once with K/V rounded through FP8, and comparing the logits.

System boundary: a fake-quantized cache (round to FP8, multiply back, attend in the model's dtype)
on any device torch runs on; a per-layer scale from that layer's largest magnitude (a calibrated
scale; an uncalibrated scale of 1 clips any value above 448). The bytes are counted, not measured.
Imports torch (not re-exported from :mod:`servelab.kv`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from servelab.model.llama import AttentionBackend, DenseCausalAttention, LlamaForCausalLM

__all__ = ["E4M3_MAX", "E4M3_UNIT_ROUNDOFF", "KV_STORE_DTYPES", "Fp8KVAttention", "KVFp8Error",
           "fp8_relative_error", "fp8_round_trip", "fp8_round_trip_per_head", "kv_fp8_logit_error",
           "kv_store_logit_errors"]

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)
"""Largest finite e4m3 value (448)."""

E4M3_UNIT_ROUNDOFF = 2.0 ** -4
"""Largest relative rounding error for a value in e4m3's normal range (3 mantissa bits, half an
ulp)."""


def fp8_round_trip(x: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """``x`` stored as e4m3 with one per-tensor scale and read back in ``x``'s dtype.

    ``scale`` None: ``max|x| / 448``, so the largest element lands on e4m3's largest value.
    Values beyond ``448 x scale`` are clipped to it (e4m3fn has no infinity).
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError("x must be a floating-point torch.Tensor")
    if scale is None:
        amax = float(x.detach().abs().max()) if x.numel() else 0.0
        scale = amax / E4M3_MAX if amax > 0 else 1.0
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0:
        raise ValueError(f"scale must be a number > 0 or None, got {scale!r}")
    stored = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return (stored.float() * scale).to(x.dtype)


def fp8_relative_error(x: torch.Tensor) -> float:
    """RMS of ``fp8_round_trip(x) - x`` over the RMS of ``x`` (0 for an all-zero tensor); no
    unit."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
        raise ValueError("x must be a non-empty floating-point torch.Tensor")
    if not torch.isfinite(x).all():
        raise ValueError("x must hold only finite values")
    ref = x.float()
    rms = ref.pow(2).mean().sqrt()
    if rms == 0:
        return 0.0
    return float((fp8_round_trip(x).float() - ref).pow(2).mean().sqrt() / rms)


def fp8_round_trip_per_head(x: torch.Tensor) -> torch.Tensor:
    """``x`` (``[..., heads, head_dim]``) stored as e4m3 with one scale per head (``max|x|`` of that
    head over every other axis, / 448) and read back in ``x``'s dtype."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2:
        raise ValueError("x must be a floating-point torch.Tensor of shape [..., heads, head_dim]")
    axes = tuple(i for i in range(x.dim()) if i != x.dim() - 2)
    scale = (x.detach().float().abs().amax(dim=axes, keepdim=True) / E4M3_MAX).clamp_min(1e-12)
    stored = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return (stored.float() * scale).to(x.dtype)


KV_STORE_DTYPES = (E4M3, torch.bfloat16, torch.float16)
"""Cache dtypes :class:`Fp8KVAttention` can store in: e4m3 with a per-tensor (or per-head) scale,
or a 16-bit cast (the reference an FP8 cache is usually compared with)."""


def _stored(x: torch.Tensor, dtype: torch.dtype, per_head: bool) -> torch.Tensor:
    if dtype != E4M3:
        return x.to(dtype).to(x.dtype)
    return fp8_round_trip_per_head(x) if per_head else fp8_round_trip(x)


class Fp8KVAttention:
    """An attention backend whose K and V pass through a cache of ``kv_dtype`` (default e4m3, one
    scale per tensor, or per KV head with ``per_head``) before attention reads them."""

    def __init__(self, inner: AttentionBackend | None = None, kv_dtype: torch.dtype = E4M3,
                 per_head: bool = False) -> None:
        if kv_dtype not in KV_STORE_DTYPES:
            raise ValueError(f"kv_dtype must be one of {KV_STORE_DTYPES}, got {kv_dtype!r}")
        self.inner = inner if inner is not None else DenseCausalAttention()
        self.kv_dtype, self.per_head = kv_dtype, bool(per_head)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> torch.Tensor:
        return self.inner(layer, q, _stored(k, self.kv_dtype, self.per_head),
                          _stored(v, self.kv_dtype, self.per_head))


@dataclass(frozen=True)
class KVFp8Error:
    """Logits with an FP8 KV cache against exact K/V, over every position of the inputs.

    ``max_abs_logit_diff`` and ``mean_abs_logit_diff`` are in logit units (nats before softmax);
    ``logit_range`` is the mean spread (max - min) of the exact logits at a position, for scale;
    ``top1_agreement`` is the share of positions whose most likely next token is unchanged.
    """

    positions: int
    max_abs_logit_diff: float
    mean_abs_logit_diff: float
    logit_range: float
    top1_agreement: float


def _token_ids(token_ids: object) -> torch.Tensor:
    rows = [list(r) for r in token_ids] if isinstance(token_ids, Sequence) else []
    if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
        raise ValueError("token_ids must be a non-empty list of equal-length, non-empty id lists")
    return torch.tensor(rows, dtype=torch.long)


def _error(exact: torch.Tensor, rounded: torch.Tensor) -> KVFp8Error:
    diff = (rounded - exact).abs()
    spread = exact.amax(-1) - exact.amin(-1)
    agree = (rounded.argmax(-1) == exact.argmax(-1)).float()
    return KVFp8Error(positions=exact.shape[:-1].numel(), max_abs_logit_diff=float(diff.max()),
                      mean_abs_logit_diff=float(diff.mean()), logit_range=float(spread.mean()),
                      top1_agreement=float(agree.mean()))


@torch.no_grad()
def kv_store_logit_errors(model: LlamaForCausalLM, token_ids: Sequence[Sequence[int]],
                          stores: Mapping[str, Fp8KVAttention]) -> dict[str, KVFp8Error]:
    """Run ``token_ids`` (equal-length rows of ids) through ``model`` once with exact K/V and once
    per named cache backend of ``stores``, and compare the logits at every position."""
    if not isinstance(model, LlamaForCausalLM):
        raise ValueError(f"model must be a LlamaForCausalLM, got {type(model).__name__}")
    ids = _token_ids(token_ids)
    if not stores or not all(isinstance(b, Fp8KVAttention) for b in stores.values()):
        raise ValueError("stores must map names to Fp8KVAttention backends (at least one)")
    exact = model(ids).float()
    return {name: _error(exact, model(ids, backend=backend).float())
            for name, backend in stores.items()}


def kv_fp8_logit_error(model: LlamaForCausalLM, token_ids: Sequence[Sequence[int]],
                       kv_dtype: torch.dtype = E4M3, per_head: bool = False) -> KVFp8Error:
    """:func:`kv_store_logit_errors` for one cache: K/V stored in ``kv_dtype`` (default e4m3)."""
    store = Fp8KVAttention(kv_dtype=kv_dtype, per_head=per_head)
    return kv_store_logit_errors(model, token_ids, {"cache": store})["cache"]
