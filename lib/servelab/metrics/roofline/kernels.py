"""One decode step split into its two kernels: the weight GEMMs and attention over the KV cache.

:func:`servelab.metrics.roofline.decode_cost` adds both into one intensity. They behave differently
as the batch grows: the weight GEMMs share one read of the weights among all sequences, so their
intensity rises with the batch (about ``batch x 2 / bytes_per_elem`` FLOP/byte) and crosses a ridge
point; attention reads each sequence's own cache, so its intensity is fixed by the model's shape
whatever the batch. Units: FLOP, bytes, FLOP/byte. Activations are ignored, as in the analytic
roofline.
"""

from __future__ import annotations

from collections.abc import Sequence

from servelab._validate import require_int, require_real
from servelab.metrics.roofline.analytic import ModelShape, PhaseCost

__all__ = ["decode_attention_cost", "decode_weight_cost", "first_batch_at_ridge"]


def _shape(model: object) -> ModelShape:
    if not isinstance(model, ModelShape):
        raise TypeError(f"model must be a ModelShape, got {type(model).__name__}")
    return model


def decode_weight_cost(model: ModelShape, batch: int = 1) -> PhaseCost:
    """The weight GEMMs of one decode step: 2P FLOPs per sequence over one read of the weights."""
    m = _shape(model)
    b = require_int("batch", batch, 1)
    return PhaseCost(2 * m.params * b, m.weight_bytes)


def decode_attention_cost(model: ModelShape, context_len: int, batch: int = 1) -> PhaseCost:
    """Attention of one decode step: 4 x layers x hidden x context FLOPs per sequence over that
    sequence's own ``context_len`` cached tokens."""
    m = _shape(model)
    ctx = require_int("context_len", context_len, 1)
    b = require_int("batch", batch, 1)
    return PhaseCost(4 * m.n_layers * m.hidden_size * ctx * b, b * ctx * m.kv_bytes_per_token)


def first_batch_at_ridge(costs: Sequence[tuple[int, PhaseCost]], ridge: float) -> int | None:
    """The first batch of ``(batch, cost)`` pairs (in the order given) whose intensity reaches
    ``ridge`` FLOP/byte, or None when none does."""
    r = require_real("ridge", ridge, 0, strict_min=True)
    return next((b for b, cost in costs if cost.intensity >= r), None)
