"""A read-only view of a KV block pool: sharing counts, owners, a snapshot for figures, invariant
checks.

:class:`BlockPoolView` (``BlockAllocator.inspect()``) never changes anything: every chapter that
draws the pool, every test that checks it, and the engine's per-step trace read through it. It sees
the pool only through :class:`BlockPoolState`, the allocator's small public read-only interface, so
it cannot reach into the allocator's bookkeeping. Units are blocks or token slots.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["SequenceBlocks", "BlockPoolState", "BlockPoolView"]


@dataclass(frozen=True)
class SequenceBlocks:
    """A copy of what the pool records for one sequence.

    ``table``: physical block ids (entry ``i`` holds logical block ``i``); ``num_tokens``: allocated
    slots; ``reserved``: blocks still reserved for it; ``tail_tokens``: token ids known for the
    partly filled last block (None when the ids are unknown and the sequence feeds no cache);
    ``num_full_keys``: chain keys of its full blocks; ``num_published``: of those, offered to the
    cache.
    """

    table: tuple[int, ...]
    num_tokens: int
    reserved: int
    tail_tokens: int | None
    num_full_keys: int
    num_published: int


class BlockPoolState(Protocol):
    """What a :class:`BlockPoolView` reads from the pool (``BlockAllocator`` provides it); all
    copies or read-only mappings."""

    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def enable_prefix_caching(self) -> bool: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def num_used_blocks(self) -> int: ...
    @property
    def num_reserved_blocks(self) -> int: ...
    @property
    def num_available_blocks(self) -> int: ...

    def refcounts(self) -> tuple[int, ...]:
        """Refcount of every physical block, by block id."""

    def is_free(self, block: int) -> bool:
        """Whether ``block`` is on the free list."""

    def sequence_blocks(self) -> dict[Hashable, SequenceBlocks]:
        """Sequence id -> its record, for every sequence holding a block table."""

    def reservations(self) -> Mapping[Hashable, int]:
        """Sequence id -> blocks reserved for it and not yet allocated."""

    def prefix_cache(self) -> Mapping[bytes, int]:
        """Chain key -> the physical block registered under it."""

    def block_keys(self) -> Mapping[int, bytes]:
        """Physical block -> the chain key it is registered under (only registered blocks)."""


class BlockPoolView:
    """Derived, read-only pictures of one pool; each call reads the pool's current state."""

    def __init__(self, pool: BlockPoolState) -> None:
        self._pool = pool

    @property
    def num_shared_blocks(self) -> int:
        """Blocks with refcount > 1: held by several block tables (a shared prefix or a fork)."""
        refcount = self._pool.refcounts()
        return len(
            {
                b
                for seq in self._pool.sequence_blocks().values()
                for b in seq.table
                if refcount[b] > 1
            }
        )

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a registered full block (evictable prefix-cache entries)."""
        refcount = self._pool.refcounts()
        return sum(1 for b in self._pool.block_keys() if refcount[b] == 0)

    def owners(self) -> dict[int, list]:
        """Physical block -> ids of the sequences whose tables hold it (only blocks in use)."""
        result: dict[int, list] = {}
        for seq_id, seq in self._pool.sequence_blocks().items():
            for block in seq.table:
                result.setdefault(block, []).append(seq_id)
        return result

    def snapshot(self) -> dict:
        """Plain-data picture of the pool for visualisation.

        ``blocks[i]`` has ``refcount``, ``owners``, ``state`` ("used", "cached" = free but still in
        the prefix cache, or "free") and ``num_filled`` (token slots holding data). ``sequences``
        maps each sequence id to its ``block_table``, ``num_tokens`` and ``reserved`` blocks.
        """
        pool, owners, filled = self._pool, self.owners(), self._filled_slots()
        refcount, keys = pool.refcounts(), pool.block_keys()
        blocks = [{"block": b, "refcount": refcount[b], "owners": owners.get(b, []),
                   "state": "used" if refcount[b] > 0 else "cached" if b in keys else "free",
                   "num_filled": filled[b]} for b in range(pool.num_blocks)]
        sequences = {
            seq_id: {
                "block_table": list(seq.table),
                "num_tokens": seq.num_tokens,
                "reserved": seq.reserved,
            }
            for seq_id, seq in pool.sequence_blocks().items()
        }
        return {
            "num_blocks": pool.num_blocks,
            "block_size": pool.block_size,
            "num_free_blocks": pool.num_free_blocks,
            "num_used_blocks": pool.num_used_blocks,
            "num_reserved_blocks": pool.num_reserved_blocks,
            "num_available_blocks": pool.num_available_blocks,
            "blocks": blocks,
            "sequences": sequences,
            "reservations": dict(pool.reservations()),
        }

    def _filled_slots(self) -> list[int]:
        """Token slots holding data per block: a used block holds what its fullest holder wrote into
        it, a cached free block is full, a free one empty."""
        size, keys = self._pool.block_size, self._pool.block_keys()
        filled = [size if b in keys else 0 for b in range(self._pool.num_blocks)]
        for seq in self._pool.sequence_blocks().values():
            for i, block in enumerate(seq.table):
                filled[block] = max(filled[block], min(size, seq.num_tokens - i * size))
        return filled

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent anywhere.

        Checked: free + used == total; refcount >= 0 and equal to the number of table references;
        refcount 0 exactly for blocks on the free list; reservations positive and their sum equal to
        ``num_reserved_blocks`` and no larger than the free list; every table has ``ceil(num_tokens
        / block_size)`` distinct blocks and (ids known) a key chain as long as its full blocks; the
        prefix cache and the per-block keys mirror each other.
        """
        pool, refs, refcount = self._pool, self._check_tables(), self._pool.refcounts()
        for block in range(pool.num_blocks):
            assert refcount[block] >= 0, f"block {block} refcount {refcount[block]} < 0"
            assert refcount[block] == refs[block], (
                f"block {block}: refcount {refcount[block]} but {refs[block]} table references")
            assert (refcount[block] == 0) == pool.is_free(block), (
                f"block {block}: refcount {refcount[block]} disagrees with the free list")
        assert pool.num_free_blocks + pool.num_used_blocks == pool.num_blocks
        reserved = pool.reservations()
        assert all(n > 0 for n in reserved.values()), "empty reservation kept"
        assert sum(reserved.values()) == pool.num_reserved_blocks, "reservation total drifted"
        assert pool.num_reserved_blocks <= pool.num_free_blocks, (
            f"{pool.num_reserved_blocks} blocks reserved but only {pool.num_free_blocks} free")
        self._check_cache()

    def _check_tables(self) -> list[int]:
        """Check every block table; returns the number of table references to each block."""
        refs = [0] * self._pool.num_blocks
        size = self._pool.block_size
        for seq_id, seq in self._pool.sequence_blocks().items():
            assert len(seq.table) == -(-seq.num_tokens // size), (
                f"seq {seq_id!r}: {len(seq.table)} blocks for {seq.num_tokens} tokens")
            assert len(set(seq.table)) == len(seq.table), f"seq {seq_id!r} holds a block twice"
            for block in seq.table:
                refs[block] += 1
            if seq.tail_tokens is not None:
                assert seq.tail_tokens == seq.num_tokens % size, (
                    f"seq {seq_id!r} tail token count mismatch"
                )
                assert seq.num_full_keys == seq.num_tokens // size, (
                    f"seq {seq_id!r} key chain is short"
                )
            assert seq.num_published <= seq.num_full_keys <= seq.num_tokens // size
        return refs

    def _check_cache(self) -> None:
        """The prefix cache (key -> block) and the per-block keys (block -> key) mirror each
        other."""
        cache, keys = self._pool.prefix_cache(), self._pool.block_keys()
        assert len(cache) == len(keys), "prefix cache and block keys disagree"
        for key, block in cache.items():
            assert keys.get(block) == key, f"cache entry for block {block} is stale"
        assert self._pool.enable_prefix_caching or not cache, "prefix cache used while disabled"
