"""The roofline on paper: ridge point, attainable FLOP/s, and the FLOPs and bytes of prefill and
decode.

It answers "which side of the ridge does this phase sit on" for an idealised dense decoder
(:class:`ModelShape`). It gives upper bounds for a thought experiment, not latency predictions:
kernels, scheduling overhead and memory-access patterns decide real timings. Units: FLOP, bytes,
FLOP/s, bytes/s and FLOP/byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab._validate import require_int, require_real
from servelab.kv import kv_bytes_per_token

__all__ = [
    "ModelShape",
    "PhaseCost",
    "attainable_flops",
    "causal_attention_flops",
    "decode_cost",
    "prefill_cost",
    "ridge_point",
]


def ridge_point(peak_flops: float, mem_bandwidth: float) -> float:
    """Ridge point I* = peak FLOP/s / memory bytes/s, in FLOP/byte.

    A kernel whose arithmetic intensity is below I* cannot reach peak compute on this device.
    """
    peak = require_real("peak_flops", peak_flops, 0.0, strict_min=True)
    bw = require_real("mem_bandwidth", mem_bandwidth, 0.0, strict_min=True)
    return peak / bw


def attainable_flops(intensity: float, peak_flops: float, mem_bandwidth: float) -> float:
    """Roofline ceiling min(peak, intensity x bandwidth), FLOP/s, for intensity in FLOP/byte."""
    i = require_real("intensity", intensity, 0.0)
    peak = require_real("peak_flops", peak_flops, 0.0, strict_min=True)
    bw = require_real("mem_bandwidth", mem_bandwidth, 0.0, strict_min=True)
    return min(peak, i * bw)


@dataclass(frozen=True)
class ModelShape:
    """An idealised dense decoder for roofline arithmetic.

    ``params`` counts weights; ``hidden_size`` = query heads x head dim (the attention-score width);
    ``bytes_per_elem`` applies to weights and KV alike.
    """

    params: int
    n_layers: int
    hidden_size: int
    n_kv_heads: int
    head_dim: int
    bytes_per_elem: int

    def __post_init__(self) -> None:
        for name in (
            "params",
            "n_layers",
            "hidden_size",
            "n_kv_heads",
            "head_dim",
            "bytes_per_elem",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int >= 1")
            if value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value}")

    @property
    def weight_bytes(self) -> int:
        return self.params * self.bytes_per_elem

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(
            self.n_layers, self.n_kv_heads, self.head_dim, self.bytes_per_elem
        )


@dataclass(frozen=True)
class PhaseCost:
    """FLOPs and bytes of one forward pass, and their ratio (FLOP/byte)."""

    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def _require_shape(model: object) -> ModelShape:
    if not isinstance(model, ModelShape):
        raise TypeError("model must be a ModelShape")
    return model


def causal_attention_flops(n_layers: int, hidden_size: int, prompt_len: int) -> int:
    """FLOPs of causal self-attention over a prompt of ``prompt_len`` tokens, the one
    prefill-attention count of the library: the scores Q K^T and the weighted sum of V cost 2 x 2 x
    ``hidden_size`` per (query, key) pair, and a causal mask leaves each token scoring itself and
    every earlier one, L(L+1)/2 pairs per
    layer: 2 x layers x hidden x L(L+1). (Computing every score, masked or not, would cost 4 x
    layers x hidden x L^2, about twice as much.)"""
    return 2 * require_int("n_layers", n_layers, 1) * require_int("hidden_size", hidden_size, 1) \
        * require_int("prompt_len", prompt_len, 1) * (prompt_len + 1)


def prefill_cost(model: ModelShape, prompt_len: int, batch: int = 1) -> PhaseCost:
    """One prefill pass over ``batch`` prompts of ``prompt_len`` tokens.

    FLOPs: 2P per token for the weight matmuls plus causal attention
    (:func:`causal_attention_flops`, 2 x layers x hidden x L(L+1) per prompt).
    Bytes: weights read once, plus the prompt's KV written once. Activations are ignored.
    """
    m = _require_shape(model)
    n = require_int("prompt_len", prompt_len, 1)
    b = require_int("batch", batch, 1)
    flops = b * (2 * m.params * n + causal_attention_flops(m.n_layers, m.hidden_size, n))
    return PhaseCost(flops, m.weight_bytes + b * n * m.kv_bytes_per_token)


def decode_cost(model: ModelShape, context_len: int, batch: int = 1) -> PhaseCost:
    """One decode step for ``batch`` sequences, each attending over ``context_len`` cached tokens.

    FLOPs: 2P + 4 x layers x hidden x context per sequence. Bytes: weights read once for the whole
    batch, plus every sequence's KV read (context_len tokens each). Activations are ignored.
    """
    m = _require_shape(model)
    ctx = require_int("context_len", context_len, 1)
    b = require_int("batch", batch, 1)
    flops = b * (2 * m.params + 4 * m.n_layers * m.hidden_size * ctx)
    return PhaseCost(flops, m.weight_bytes + b * ctx * m.kv_bytes_per_token)
