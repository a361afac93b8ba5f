"""Host swap space, where a sequence preempted by swap keeps its KV.

Only ``EngineConfig(preemption_mode="swap")`` under KV pressure uses it: ``Scheduler.swap_out`` copies a
victim's computed blocks here, ``Scheduler.swap_in`` (called by a tick while something is swapped out)
writes them into fresh device blocks, and a swapped sequence that ends drops its copy
(``Scheduler.release``). The scheduler owns the queues, so the swaps that move sequences between them are
its methods; this module holds only the host copies. No ordinary step touches it.

System boundary: host tensors, counted in blocks of the device pool (``EngineConfig.swap_space_bytes``
divided by the bytes of one block, all layers, K and V).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from servelab.engine.config import EngineConfig
    from servelab.engine.kv_cache import KVCache


class HostSwapSpace:
    """Host memory for the swapped-out KV of ``cache``, counted in blocks (``capacity`` of them), one copy
    per sequence id."""

    def __init__(self, capacity_blocks: int, cache: "KVCache") -> None:
        self.cache = cache
        self.capacity = capacity_blocks
        self.in_use = 0  # blocks' worth of host memory holding some sequence's KV
        self._data: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}

    def store(self, owner: str, blocks: list[int]) -> bool:
        """Copy ``blocks`` of the cache (all layers, K and V) to host memory for ``owner``; False (nothing
        copied) when full."""
        cache = self.cache
        if self.in_use + len(blocks) > self.capacity:
            return False
        index = torch.tensor(blocks, device=cache.k.device, dtype=torch.long)
        self._data[owner] = (cache.k[:, :, index].to("cpu", copy=True), cache.v[:, :, index].to("cpu", copy=True),
                             len(blocks))
        self.in_use += len(blocks)
        return True

    def restore(self, owner: str, blocks: list[int]) -> None:
        """Write ``owner``'s host copy into the physical ``blocks`` of the cache (same order) and free it."""
        cache = self.cache
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


def host_swap_space(config: "EngineConfig", cache: "KVCache", bytes_per_block: int) -> HostSwapSpace | None:
    """The host swap space ``config.swap_space_bytes`` pays for (``bytes_per_block`` each, all layers, K
    and V), or None when that is not one block; used only under ``preemption_mode="swap"``."""
    blocks = config.swap_space_bytes // bytes_per_block
    return HostSwapSpace(blocks, cache) if blocks else None
