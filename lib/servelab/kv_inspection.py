"""Read-only views of a ``BlockAllocator``: counts, block tables, owners, a snapshot and invariant checks.

:class:`BlockPoolInspection` is the half of :class:`servelab.kv_allocator.BlockAllocator` that never
changes anything: every chapter that draws the pool, every test that checks it, and the engine's per-step
trace read through it. It reads the allocator's fields directly (it is part of the same class).

System boundary: block ids, counts and plain dicts; no tensors. Units are blocks or token slots.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from servelab._validate import require_index


class BlockPoolInspection:
    """Inspection methods mixed into ``BlockAllocator`` (fields are set by its ``__init__``)."""

    _num_blocks: int
    _block_size: int
    _caching: bool
    _cache_on_compute: bool
    _refcount: list[int]
    _free: OrderedDict[int, None]
    _cache: dict[bytes, int]
    _key_of: dict[int, bytes]
    _seqs: dict
    _reserved: dict[Hashable, int]
    _total_reserved: int

    @property
    def num_blocks(self) -> int:
        """Physical blocks in the pool."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Token slots per block."""
        return self._block_size

    @property
    def enable_prefix_caching(self) -> bool:
        """Whether full blocks are registered and matched in the prefix cache."""
        return self._caching

    @property
    def cache_on_compute(self) -> bool:
        """Whether full blocks wait for ``mark_computed`` before entering the prefix cache."""
        return self._cache_on_compute

    @property
    def num_free_blocks(self) -> int:
        """Blocks with refcount 0, including cached ones that a prefix hit could still revive."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks with refcount > 0."""
        return self._num_blocks - len(self._free)

    @property
    def num_shared_blocks(self) -> int:
        """Blocks with refcount > 1: held by several block tables (a shared prefix or a fork)."""
        refcount = self._refcount  # scan the tables, not the pool: a step reads this, and tables are short
        return len({b for seq in self._seqs.values() for b in seq.table if refcount[b] > 1})

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a registered full block (evictable prefix-cache entries)."""
        return sum(1 for b in self._key_of if self._refcount[b] == 0)

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks promised by reservations and not yet physically allocated."""
        return self._total_reserved

    def refcount(self, block: int) -> int:
        """Number of block-table references to physical block ``block``."""
        return self._refcount[require_index("block", block, 0, self._num_blocks - 1)]

    def has_sequence(self, seq_id: Hashable) -> bool:
        """True while ``seq_id`` has a block table (allocated and not yet freed)."""
        return seq_id in self._seqs

    def block_table(self, seq_id: Hashable) -> list[int]:
        """Copy of the sequence's block table: entry ``i`` is the physical block of logical block ``i``."""
        return list(self._seq(seq_id).table)

    def num_tokens(self, seq_id: Hashable) -> int:
        """Token slots allocated to the sequence (not necessarily computed yet)."""
        return self._seq(seq_id).num_tokens

    def reserved_blocks(self, seq_id: Hashable) -> int:
        """Blocks still reserved for ``seq_id`` (0 when it holds no reservation)."""
        return self._reserved.get(seq_id, 0)

    def owners(self) -> dict[int, list]:
        """Physical block -> ids of the sequences whose tables hold it (only blocks in use)."""
        result: dict[int, list] = {}
        for seq_id, seq in self._seqs.items():
            for block in seq.table:
                result.setdefault(block, []).append(seq_id)
        return result

    def snapshot(self) -> dict:
        """Plain-data picture of the pool for visualisation.

        ``blocks[i]`` has ``refcount``, ``owners``, ``state`` ("used", "cached" = free but still in the
        prefix cache, or "free") and ``num_filled`` (token slots holding data). ``sequences`` maps each
        sequence id to its ``block_table``, ``num_tokens`` and ``reserved`` blocks.
        """
        owners = self.owners()
        filled = self._filled_slots()
        blocks = [{"block": b, "refcount": self._refcount[b], "owners": owners.get(b, []),
                   "state": "used" if self._refcount[b] > 0 else "cached" if b in self._key_of else "free",
                   "num_filled": filled[b]} for b in range(self._num_blocks)]
        sequences = {seq_id: {"block_table": list(seq.table), "num_tokens": seq.num_tokens,
                              "reserved": self._reserved.get(seq_id, 0)} for seq_id, seq in self._seqs.items()}
        return {"num_blocks": self._num_blocks, "block_size": self._block_size,
                "num_free_blocks": self.num_free_blocks, "num_used_blocks": self.num_used_blocks,
                "num_reserved_blocks": self._total_reserved, "num_available_blocks": self.num_available_blocks,
                "blocks": blocks, "sequences": sequences, "reservations": dict(self._reserved)}

    def _filled_slots(self) -> list[int]:
        """Token slots holding data per block, computed here rather than kept on the hot path: a used
        block holds what its fullest holder wrote into it, a cached free block is full, a free one empty."""
        size = self._block_size
        filled = [size if b in self._key_of else 0 for b in range(self._num_blocks)]
        for seq in self._seqs.values():
            for i, block in enumerate(seq.table):
                filled[block] = max(filled[block], min(size, seq.num_tokens - i * size))
        return filled

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent anywhere.

        Checked: free + used == total; refcount >= 0 and equal to the number of table references;
        refcount 0 exactly for blocks on the free list; reservations positive and their sum equal to
        ``num_reserved_blocks`` and no larger than the free list; every table has
        ``ceil(num_tokens / block_size)`` distinct blocks and (ids known) a key chain as long as its full
        blocks; the prefix cache and the per-block keys mirror each other.
        """
        refs = self._check_tables()
        for block in range(self._num_blocks):
            assert self._refcount[block] >= 0, f"block {block} refcount {self._refcount[block]} < 0"
            assert self._refcount[block] == refs[block], (
                f"block {block}: refcount {self._refcount[block]} but {refs[block]} table references")
            assert (self._refcount[block] == 0) == (block in self._free), (
                f"block {block}: refcount {self._refcount[block]} disagrees with the free list")
        assert len(self._free) + self.num_used_blocks == self._num_blocks
        assert all(n > 0 for n in self._reserved.values()), "empty reservation kept"
        assert sum(self._reserved.values()) == self._total_reserved, "reservation total drifted"
        assert self._total_reserved <= len(self._free), (
            f"{self._total_reserved} blocks reserved but only {len(self._free)} free")
        assert len(self._cache) == len(self._key_of), "prefix cache and block keys disagree"
        for key, block in self._cache.items():
            assert self._key_of.get(block) == key, f"cache entry for block {block} is stale"
        assert self._caching or not self._cache, "prefix cache used while disabled"

    def _check_tables(self) -> list[int]:
        """Check every block table; returns the number of table references to each block."""
        refs = [0] * self._num_blocks
        size = self._block_size
        for seq_id, seq in self._seqs.items():
            assert len(seq.table) == -(-seq.num_tokens // size), (
                f"seq {seq_id!r}: {len(seq.table)} blocks for {seq.num_tokens} tokens")
            assert len(set(seq.table)) == len(seq.table), f"seq {seq_id!r} holds a block twice"
            for block in seq.table:
                refs[block] += 1
            if seq.tail is not None:
                assert len(seq.tail) == seq.num_tokens % size, f"seq {seq_id!r} tail token count mismatch"
                assert len(seq.full_keys) == seq.num_tokens // size, f"seq {seq_id!r} key chain is short"
            assert seq.num_published <= len(seq.full_keys) <= seq.num_tokens // size
        return refs
