"""Host swap space: where a sequence preempted by swap keeps its KV until it is swapped back in.

Only ``EngineConfig(preemption_mode="swap")`` under KV pressure uses it: ``ModelRunner.swap_out`` copies a
victim's computed blocks here, ``ModelRunner.swap_in`` writes them into fresh device blocks, and a swapped
sequence that ends drops its copy (``ModelRunner.drop_swapped``). No ordinary step touches it.

System boundary: host tensors, counted in blocks of the device pool (``EngineConfig.swap_space_bytes``
divided by the bytes of one block, all layers, K and V).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from servelab.engine.model_runner import KVCache


class HostSwapSpace:
    """Host memory for swapped-out KV, counted in blocks (``capacity`` of them), one copy per sequence id."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.in_use = 0  # blocks' worth of host memory holding some sequence's KV
        self._data: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}

    def store(self, owner: str, cache: "KVCache", blocks: list[int]) -> bool:
        """Copy ``blocks`` of ``cache`` (all layers, K and V) to host memory for ``owner``; False (nothing
        copied) when full."""
        if self.in_use + len(blocks) > self.capacity:
            return False
        index = torch.tensor(blocks, device=cache.k.device, dtype=torch.long)
        self._data[owner] = (cache.k[:, :, index].to("cpu", copy=True), cache.v[:, :, index].to("cpu", copy=True),
                             len(blocks))
        self.in_use += len(blocks)
        return True

    def restore(self, owner: str, cache: "KVCache", blocks: list[int]) -> None:
        """Write ``owner``'s host copy into the physical ``blocks`` of ``cache`` (same order) and free it."""
        k, v, _ = self._data[owner]
        self.release(owner)
        index = torch.tensor(blocks, device=cache.k.device, dtype=torch.long)
        cache.k[:, :, index] = k.to(cache.k.device)
        cache.v[:, :, index] = v.to(cache.v.device)

    def release(self, owner: str) -> int:
        """Free everything ``owner`` holds, stored tensors included; returns the blocks released (0 if none)."""
        _, _, blocks = self._data.pop(owner, (None, None, 0))
        self.in_use -= blocks
        return blocks
