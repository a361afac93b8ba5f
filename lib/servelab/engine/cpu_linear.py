"""Linear layers on the CPU through oneDNN with prepacked weights, for steps of more than one row.

A decode step of ``B`` sequences multiplies ``B`` rows by every weight matrix. With one row this is a GEMV
that streams the weight once, and torch's default (MKL ``sgemm`` on the column-major layout of
:func:`servelab.device.use_gemv_layout`) runs it near the read bandwidth. With 8 or 32 rows the same call
became a small-``M`` GEMM that ran far below the CPU's peak: measured on a 2-core AMD EPYC (AVX-512, torch
2.13, fp32, one thread, CPU time of the thread), SmolLM2-135M's 49,152 x 576 LM head took 20.3 ms at 8 rows
and 36.2 ms at 32, against 7.6 and 18.6 ms through oneDNN on a weight reordered once into its blocked
layout (``torch.ops.mkldnn._reorder_linear_weight``, what ``torch.compile``'s CPU backend uses); a 3,072 x 576
layer 0.91 -> 0.49 ms at 8 rows. So :func:`pack_linears` gives each ``nn.Linear`` a packed copy of its weight,
used whenever a call has more than one row; one row keeps the plain GEMV. That switch changes a
row's reduction order with the row count, so in batch-invariant mode
(:mod:`servelab.engine.batch_invariant`) every call takes the packed path, in tiles of a fixed row
count.

Costs and limits: the packed copy doubles the memory of the linear weights (the original stays: the tied
embedding reads it, and so do one-row calls); results differ from MKL's in the last bits of fp32 (the
reduction order), as two BLAS libraries do. The packed copy is used only while the weight is the one it was
made from (same storage, dtype and version) and without autograd; otherwise the layer falls back to
``F.linear``. A deep copy of the model gets no packed copies (they live in a table keyed by the module).

System boundary: CPU float32 / bfloat16 ``nn.Linear`` modules of a model, in place; nothing else changes.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from servelab.engine import batch_invariant

__all__ = ["PackedLinear", "pack_linears"]

_PACKED: "weakref.WeakKeyDictionary[torch.nn.Linear, tuple[tuple, torch.Tensor]]" = weakref.WeakKeyDictionary()
PACKED_DTYPES = (torch.float32, torch.bfloat16)


def _key(weight: torch.Tensor) -> tuple:
    """What identifies the weight a packed copy was made from."""
    return weight.data_ptr(), weight.dtype, weight._version


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose calls with more than one row go through oneDNN on a prepacked weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        entry = _PACKED.get(self)
        rows = x.numel() // self.in_features
        one_row = rows <= 1 and not batch_invariant.is_active()  # invariant: always packed
        if (entry is None or one_row or entry[0] != _key(self.weight)
                or (torch.is_grad_enabled() and self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, self.in_features), entry[1], self.bias,
                                                 "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)


def pack_linears(model: torch.nn.Module, rows_hint: int = 32) -> int:
    """Give every CPU float32 / bfloat16 ``nn.Linear`` of ``model`` a weight packed for oneDNN (laid out for
    about ``rows_hint`` rows; any row count works) and make it a :class:`PackedLinear`. Packing again
    replaces the copies (after a dtype change, say). Returns how many layers were packed (0 where torch has
    no oneDNN)."""
    if not torch.backends.mkldnn.is_available():
        return 0
    packed = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        weight = module.weight
        if weight.device.type != "cpu" or weight.dtype not in PACKED_DTYPES:
            continue
        with torch.no_grad():
            copy = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows_hint)
        _PACKED[module] = (_key(weight), copy)
        module.__class__ = PackedLinear
        packed += 1
    return packed
