"""Why the same row gives different bits in a different batch: a split reduction in low precision.

A kernel that sums ``n`` numbers often splits them into ``n_splits`` contiguous chunks (split-K in a
matmul, split-KV in decode attention), sums each chunk, then sums the partial results.
Floating-point addition is not associative, so the answer depends on the split, and kernels
choose the split from the batch's shape: the same request alone and in a batch of 64 can be summed
differently. A batch-invariant kernel fixes the split (or reduces each row the same way at every
batch size).

:func:`split_sum` does exactly that sum, left to right in the given numpy dtype, one element at a
time (no SIMD, no pairwise tree), so the result is the same on every CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servelab._validate import require_index

__all__ = ["split_sum"]


def split_sum(values: Sequence[float], n_splits: int, dtype: type = np.float32) -> float:
    """Sum ``values`` as ``n_splits`` contiguous chunks (as equal as possible), each summed left to
    right in ``dtype``, then the partials summed left to right in ``dtype``; returned as a float.

    >>> split_sum([1.0, 2.0, 3.0], 2)
    6.0
    """
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1 or data.size == 0 or not np.isfinite(data).all():
        raise ValueError("values must be a non-empty 1-D sequence of finite numbers")
    n_splits = require_index("n_splits", n_splits, 1, data.size)
    kind = np.dtype(dtype)
    if kind.kind != "f":
        raise ValueError(f"dtype must be a numpy floating dtype, got {kind}")
    partials = []
    for chunk in np.array_split(data.astype(kind), n_splits):
        acc = kind.type(0)
        for x in chunk:
            acc = kind.type(acc + x)
        partials.append(acc)
    total = kind.type(0)
    for p in partials:
        total = kind.type(total + p)
    return float(total)
