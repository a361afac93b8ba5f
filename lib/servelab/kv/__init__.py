"""The KV cache: byte and block arithmetic, the paged block allocator, prefix-cache keys, a
read-only view of the pool, and (torch) what evicting old tokens' KV does.

* :mod:`~servelab.kv.arithmetic`: bytes per token, allocated vs logical slots, sharing counts, TP
  split.
* :mod:`~servelab.kv.block_pool`: ``BlockPool``, what one engine step calls: block tables, free
  list, refcounts, reservations, prefix hits, copy-on-write.
* :mod:`~servelab.kv.allocator`: ``BlockAllocator``, the pool plus fork, restore and the read-only
  interface.
* :mod:`~servelab.kv.prefix_cache`: chain keys of full blocks; block-hash vs radix-tree reuse.
* :mod:`~servelab.kv.inspection`: ``BlockPoolView`` (``BlockAllocator.inspect()``): snapshots,
  checks.
* :mod:`~servelab.kv.eviction`: dropping the oldest tokens' KV (imports torch; not re-exported
  here).
* :mod:`~servelab.kv.footprint`: KV bytes for MLA, sliding-window and hybrid stacks; transfer time.
* :mod:`~servelab.kv.fp8`: an e4m3 round trip, its error, and an FP8 KV cache as an attention
  backend with its measured logit error (imports torch; not re-exported here).
"""

from servelab.kv.allocator import (
    BlockAllocator,
    BlockCopy,
    DoubleFreeError,
    OutOfBlocks,
    PromptAllocation,
)
from servelab.kv.arithmetic import (
    block_alloc_slots,
    blocks_for,
    kv_bytes_per_token,
    kv_heads_per_tp_rank,
    physical_blocks_no_sharing,
    physical_blocks_with_sharing,
)
from servelab.kv.block_pool import BlockPool
from servelab.kv.inspection import BlockPoolState, BlockPoolView, SequenceBlocks
from servelab.kv.prefix_cache import full_block_keys, prefix_block_key

__all__ = [
    "kv_bytes_per_token",
    "blocks_for",
    "block_alloc_slots",
    "physical_blocks_no_sharing",
    "physical_blocks_with_sharing",
    "kv_heads_per_tp_rank",
    "prefix_block_key",
    "full_block_keys",
    "OutOfBlocks",
    "DoubleFreeError",
    "BlockCopy",
    "PromptAllocation",
    "BlockAllocator",
    "BlockPool",
    "BlockPoolState",
    "BlockPoolView",
    "SequenceBlocks",
]
