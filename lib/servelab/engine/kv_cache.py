"""The paged KV pool: one preallocated K and one V tensor of physical blocks, shared by all
sequences.

A module of its own, below the model runner that attends through it
(:mod:`servelab.engine.model_runner`) and the host swap space that copies blocks out of it
(:mod:`servelab.engine.swap`). Which blocks a sequence owns is the allocator's decision
(:mod:`servelab.kv.allocator`); this holds only the tensors.
System boundary: device tensors ``[layers, kv_heads, num_blocks, block_size, head_dim]``.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["KVCache"]


class KVCache:
    """The physical block pool: K and V tensors of shape ``[layers, kv_heads, num_blocks,
    block_size, d]``."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (num_layers, num_kv_heads, num_blocks, block_size, head_dim)
        # zeros, not empty: masked-out slots still enter the attention matmul with weight 0, and
        # 0 * NaN from uninitialised memory would poison the output
        self.k = _zeros(shape, dtype, device)
        self.v = _zeros(shape, dtype, device)
        self.block_size = block_size
        self.num_blocks = num_blocks
        # per-layer views, made once: indexing ``k[layer]`` in every layer of every step costs a
        # tensor op
        self.layer_k = list(self.k.unbind(0))  # [kv_heads, num_blocks, block_size, d] each
        self.layer_v = list(self.v.unbind(0))
        # [kv_heads, slots, d]
        self.layer_k_slots = [k.view(num_kv_heads, -1, head_dim) for k in self.layer_k]
        self.layer_v_slots = [v.view(num_kv_heads, -1, head_dim) for v in self.layer_v]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: copy physical block ``src`` into ``dst`` in every layer, for each ``(src,
        dst)``."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.k.device)
        dst = torch.tensor([d for _, d in pairs], device=self.k.device)
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor; on the CPU made of the OS's zero pages (``calloc``, through numpy), so that
    memory is committed only where a K/V write lands: a pool sized for the machine costs what it
    holds."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    raw = np.zeros((*shape[:-1], shape[-1] * torch.empty((), dtype=dtype).element_size()),
                   dtype=np.uint8)
    return torch.from_numpy(raw).view(dtype)
