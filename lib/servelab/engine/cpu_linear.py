"""Linear layers on the CPU through oneDNN with prepacked weights, for every step.

A decode step of ``B`` sequences multiplies ``B`` rows by every weight matrix. torch's default
``F.linear`` (MKL) ran both shapes below what the machine can do, measured on a 2-core AMD EPYC
(AVX-512, torch 2.13, fp32):

* with 8 or 32 rows the call is a small-``M`` GEMM far below the CPU's peak: SmolLM2-135M's
  49,152 x 576 LM head took 20.3 ms at 8 rows and 36.2 ms at 32 (one thread, CPU time), against 7.6
  and 18.6 ms through oneDNN on a weight reordered once into its blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight``, what ``torch.compile``'s CPU backend uses);
* with one row it is a GEMV that should stream the weight once at the read bandwidth, yet every
  linear weight of SmolLM2-135M once (538 MB) took 45 ms through ``F.linear`` (12 GB/s), 33 ms with
  the weights stored column-major (16 GB/s) and 22-24 ms through oneDNN's packed weight (23 GB/s),
  two threads, against 28-38 GB/s for a plain ``W.sum()`` over the same bytes. Side by side, the
  engine's batch-1 decode step ran 1.25x faster (band 1.23-1.33x) with one-row calls packed too.

So :func:`pack_linears` gives each ``nn.Linear`` a packed copy of its weight, used for every call.
The kernel still picks its blocking by the row count, so a row's last bits can change with the
batch; batch-invariant mode (:mod:`servelab.engine.batch_invariant`) calls it on tiles of a fixed
row count.

Costs and limits: the packed copy doubles the memory of the linear weights (the original stays: the
tied embedding reads it, and so does a call with autograd); results differ from MKL's in the last
bits of fp32 (the reduction order), as two BLAS libraries do. The packed copy is used only while
the weight is the one it was made from (same storage, dtype and version) and without autograd;
otherwise the layer falls back to ``F.linear``. A deep copy of the model gets no packed copies
(they live in a table keyed by the module).

System boundary: CPU float32 / bfloat16 ``nn.Linear`` modules of a model, in place; nothing else
changes.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

__all__ = ["PackedLinear", "pack_linears"]

_PACKED: "weakref.WeakKeyDictionary[torch.nn.Linear, tuple[tuple, torch.Tensor]]" = (
    weakref.WeakKeyDictionary()
)
PACKED_DTYPES = (torch.float32, torch.bfloat16)


def _key(weight: torch.Tensor) -> tuple:
    """What identifies the weight a packed copy was made from."""
    return weight.data_ptr(), weight.dtype, weight._version


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose calls go through oneDNN on a prepacked weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        entry = _PACKED.get(self)
        rows = x.numel() // self.in_features
        if (entry is None or rows == 0 or entry[0] != _key(self.weight)
                or (torch.is_grad_enabled() and self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        out = torch.ops.mkldnn._linear_pointwise(
            x.reshape(rows, self.in_features), entry[1], self.bias, "none", [], ""
        )
        return out.view(*x.shape[:-1], self.out_features)


def pack_linears(model: torch.nn.Module, rows_hint: int = 32) -> int:
    """Give every CPU float32 / bfloat16 ``nn.Linear`` of ``model`` a weight packed for oneDNN (laid
    out for about ``rows_hint`` rows; any row count works) and make it a :class:`PackedLinear`.
    Packing again replaces the copies (after a dtype change, say). Returns how many layers were
    packed (0 where torch has no oneDNN)."""
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
