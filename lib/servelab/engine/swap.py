"""Swapping: host swap space, where a sequence preempted by swap keeps its KV, and the scheduler's swaps.

Only ``EngineConfig(preemption_mode="swap")`` under KV pressure uses it: :func:`swap_out` copies a
victim's computed blocks here, :func:`swap_in` (called by a tick while something is swapped out) writes
them into fresh device blocks, and a swapped sequence that ends drops its copy (``Scheduler.release``).
No ordinary step touches it.

System boundary: host tensors, counted in blocks of the device pool (``EngineConfig.swap_space_bytes``
divided by the bytes of one block, all layers, K and V).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from servelab.engine.sequence import SeqStatus
from servelab.kv.arithmetic import blocks_for

if TYPE_CHECKING:
    from servelab.engine.config import EngineConfig
    from servelab.engine.model_runner import KVCache
    from servelab.engine.scheduler import Scheduler, SchedulerOutput
    from servelab.engine.sequence import Sequence


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


def swap_out(scheduler: "Scheduler", seq: "Sequence", out: "SchedulerOutput") -> bool:
    """Preempt ``seq`` (already out of the running queue and its batch slots) by swap: copy its computed KV
    to host memory, free its device blocks and queue it as swapped. False, nothing done, when it has no
    computed KV, or there is no host swap space or not enough of it left."""
    space, computed = scheduler.swap_space, blocks_for(seq.num_computed, scheduler.config.block_size)
    if space is None or not computed:
        return False
    if not space.store(seq.seq_id, scheduler.allocator.block_table(seq.seq_id)[:computed]):
        return False
    scheduler.allocator.free(seq.seq_id)
    seq.status = SeqStatus.SWAPPED
    scheduler.swapped.append(seq)
    out.swapped_out.append(seq.seq_id)
    return True


def swap_in(scheduler: "Scheduler", out: "SchedulerOutput") -> None:
    """One tick's swap-ins: bring swapped sequences (not paused ones) back while batch slots and blocks
    allow, best-ranked first; each gets fresh blocks (``BlockAllocator.restore``) its host copy is written
    into, and rejoins the running queue."""
    scheduler.swapped.sort(key=scheduler.key)
    for seq in [s for s in scheduler.swapped if not s.paused]:
        if scheduler.slots.available < seq.batch_slots:
            return
        if not scheduler.allocator.reserve(seq.seq_id, blocks_for(seq.num_tokens, scheduler.config.block_size)):
            return  # its KV plus the slots of its next chunk
        scheduler.slots.acquire(seq.seq_id, seq.batch_slots)
        blocks = scheduler.allocator.restore(seq.seq_id, seq.num_computed, seq.token_ids[:seq.num_computed],
                                             namespace=seq.namespace)
        scheduler.allocator.release_reservation(seq.seq_id)
        scheduler.swap_space.restore(seq.seq_id, blocks)
        scheduler.allocator.mark_computed(seq.seq_id, seq.num_computed)  # the KV is back: offer it to the cache
        scheduler.swapped.remove(seq)
        seq.status = SeqStatus.RUNNING
        scheduler.running.append(seq)
        out.swapped_in.append(seq.seq_id)
