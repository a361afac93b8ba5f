"""FP8 (e4m3) KV: what one round trip through the format does to a tensor's values.

An FP8 KV cache stores each K and V element in one byte instead of two (bf16), so a token costs half
the bytes and a decode step's attention reads half as many. The price is rounding: e4m3 keeps 3
mantissa bits, so a value inside the format's range is off by at most ``2**-4`` of itself (half a
unit in the last place), and values beyond ``E4M3_MAX`` would overflow, which is why engines store a
scale with the cache (vLLM: ``k_scale``/``v_scale`` per layer, 1.0 unless calibrated or computed).

:func:`fp8_roundtrip` applies one per-tensor scale (the absolute maximum mapped to ``E4M3_MAX``),
casts to ``torch.float8_e4m3fn`` and back; :func:`fp8_relative_error` reports the RMS error relative
to the RMS value. Runs on the CPU (torch's float8 dtypes cast there); the cast is exact arithmetic,
so the numbers do not depend on the CPU's kernels. Imports torch; not re-exported by
``servelab.kv``.
"""

from __future__ import annotations

import torch

__all__ = ["E4M3_MAX", "E4M3_UNIT_ROUNDOFF", "fp8_roundtrip", "fp8_relative_error"]

E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)
"""Largest finite e4m3 value (448)."""

E4M3_UNIT_ROUNDOFF = 2.0 ** -4
"""Largest relative rounding error for a value in e4m3's normal range (3 mantissa bits, half an
ulp)."""


def _require_float_tensor(x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
        raise ValueError("x must be a non-empty floating-point torch.Tensor")
    if not torch.isfinite(x).all():
        raise ValueError("x must hold only finite values")
    return x


def fp8_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """``x`` stored as e4m3 with one per-tensor scale (``amax / E4M3_MAX``) and read back, in the
    dtype of ``x``."""
    x = _require_float_tensor(x)
    amax = x.abs().max().float()
    scale = amax / E4M3_MAX if amax > 0 else torch.tensor(1.0)
    stored = (x.float() / scale).to(torch.float8_e4m3fn)
    return (stored.float() * scale).to(x.dtype)


def fp8_relative_error(x: torch.Tensor) -> float:
    """RMS of ``fp8_roundtrip(x) - x`` over the RMS of ``x`` (0 for an all-zero tensor); no unit."""
    x = _require_float_tensor(x)
    ref = x.float()
    rms = ref.pow(2).mean().sqrt()
    if rms == 0:
        return 0.0
    return float((fp8_roundtrip(x).float() - ref).pow(2).mean().sqrt() / rms)
