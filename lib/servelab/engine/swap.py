"""Host swap space, where a sequence preempted by swap keeps its KV.

Only ``EngineConfig(preemption_mode="swap")`` under KV pressure uses it: ``Scheduler.swap_out``
copies a victim's computed blocks here, ``Scheduler.swap_in`` (called by a tick while something is
swapped out) writes them into fresh device blocks, and a swapped sequence that ends drops its copy
(§0's ``reclaim``, which releases it like the batch slots: the space is a ``SlotPool`` of host
blocks). The scheduler owns the queues, so the swaps that move sequences between them are its
methods; this module holds only the host copies. No ordinary step touches it.

System boundary: host tensors, counted in blocks of the device pool
(``EngineConfig.swap_space_bytes`` divided by the bytes of one block, all layers, K and V).
"""

from __future__ import annotations

import torch

from servelab.engine.config import EngineConfig
from servelab.engine.kv_cache import KVCache
from servelab.lifecycle.state_machine import SlotPool


class HostSwapSpace(SlotPool):
    """Host memory for the swapped-out KV of ``cache``, one copy per sequence id.

    Its accounting is §0's :class:`~servelab.lifecycle.state_machine.SlotPool` of host blocks
    (``capacity``, ``in_use``, ``held_by``; a store is all-or-nothing), so the one swap model the
    course teaches is the one the engine runs, and ``reclaim`` releases a swapped sequence's copy
    through :meth:`release` like any other pool. This class adds the copies themselves.
    """

    def __init__(self, capacity_blocks: int, cache: KVCache) -> None:
        super().__init__(capacity_blocks)
        self.cache = cache
        self._data: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def store(self, owner: str, blocks: list[int]) -> bool:
        """Copy ``blocks`` of the cache (all layers, K and V) to host memory for ``owner``; False
        (nothing copied) when full."""
        if not self.acquire(owner, len(blocks)):
            return False
        cache = self.cache
        index = torch.tensor(blocks, device=cache.k.device, dtype=torch.long)
        self._data[owner] = (
            cache.k[:, :, index].to("cpu", copy=True),
            cache.v[:, :, index].to("cpu", copy=True),
        )
        return True

    def restore(self, owner: str, blocks: list[int]) -> None:
        """Write ``owner``'s host copy into the physical ``blocks`` of the cache (same order) and
        free it."""
        cache = self.cache
        k, v = self._data[owner]
        self.release(owner)
        index = torch.tensor(blocks, device=cache.k.device, dtype=torch.long)
        cache.k[:, :, index] = k.to(cache.k.device)
        cache.v[:, :, index] = v.to(cache.v.device)

    def release(self, owner: str) -> int:
        """Free everything ``owner`` holds, stored tensors included; returns the blocks released (0
        if none)."""
        self._data.pop(owner, None)
        return super().release(owner)


def host_swap_space(
    config: EngineConfig, cache: KVCache, bytes_per_block: int
) -> HostSwapSpace | None:
    """The host swap space ``config.swap_space_bytes`` pays for (``bytes_per_block`` each, all
    layers, K and V), or None when that is not one block; used only under
    ``preemption_mode="swap"``."""
    blocks = config.swap_space_bytes // bytes_per_block
    return HostSwapSpace(blocks, cache) if blocks else None
