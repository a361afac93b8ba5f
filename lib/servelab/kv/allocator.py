"""``BlockAllocator``: the paged KV block allocator, the :class:`~servelab.kv.block_pool.BlockPool`
one step uses plus what no ordinary step calls: ``fork`` (parallel sampling), ``restore`` (a
swap-in), ``truncate`` (speculative decoding's rollback), ``can_append``, and the small read-only
interface (refcounts, tables, reservations, the prefix cache) that ``inspect()`` wraps in a
:class:`~servelab.kv.inspection.BlockPoolView` (sharing counts, owners, snapshots, invariant
checks). Units are blocks or token slots.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from types import MappingProxyType

from servelab._validate import require_index, require_indices, require_type
from servelab.kv.arithmetic import blocks_for
from servelab.kv.block_pool import (
    BlockCopy,
    BlockPool,
    DoubleFreeError,
    OutOfBlocks,
    PromptAllocation,
    _BlockTable,
)
from servelab.kv.inspection import BlockPoolView, SequenceBlocks

__all__ = ["OutOfBlocks", "DoubleFreeError", "BlockCopy", "PromptAllocation", "BlockAllocator"]


class BlockAllocator(BlockPool):
    """The paged KV block manager (see :class:`~servelab.kv.block_pool.BlockPool` for the model and
    the step's calls): a pool of ``num_blocks`` blocks of ``block_size`` token slots.

    >>> alloc = BlockAllocator(num_blocks=8, block_size=4)
    >>> alloc.reserve("a", 3)  # admission: bookkeeping only
    True
    >>> alloc.allocate_prompt("a", [1, 2, 3, 4, 5, 6])  # a tick picks it: 2 blocks from the reservation
    PromptAllocation(cached_prompt_tokens=0, copies=())
    >>> alloc.append_tokens("a", [7])  # a slot for the next token's KV; fits the tail block
    ()
    >>> alloc.lookup_prefix([1, 2, 3, 4, 9])  # its first block is in the prefix cache
    4
    >>> alloc.allocate_prompt("b", [1, 2, 3, 4, 9]).cached_prompt_tokens
    4
    >>> alloc.inspect().num_shared_blocks, alloc.num_used_blocks, alloc.num_available_blocks
    (1, 3, 4)
    >>> alloc.fork("a", "c")  # the child shares both of a's blocks
    >>> alloc.refcount(alloc.block_table("a")[0]), alloc.num_used_blocks
    (3, 3)
    """

    def lookup_prefix(self, token_ids: Sequence[int], namespace: str = "") -> int:
        """Prompt tokens a prefix hit would supply (whole blocks, at most ``len(token_ids) - 1``:
        the last prompt token is computed for the first sample's logits), as ``allocate_prompt``
        would report."""
        matched = self._match(token_ids, namespace)
        return min(len(matched) * self._block_size, len(token_ids) - 1)

    # ------------------------------------------------------------------ read-only interface
    @property
    def num_blocks(self) -> int:
        """Physical blocks in the pool."""
        return self._num_blocks

    @property
    def block_size(self) -> int:
        """Token slots per block."""
        return self._block_size

    @property
    def num_free_blocks(self) -> int:
        """Blocks with refcount 0, including cached ones that a prefix hit could still revive."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks with refcount > 0."""
        return self._num_blocks - len(self._free)

    @property
    def enable_prefix_caching(self) -> bool:
        """Whether full blocks are registered and matched in the prefix cache."""
        return self._caching

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks promised by reservations and not yet physically allocated."""
        return self._total_reserved

    def refcount(self, block: int) -> int:
        """Number of block-table references to physical block ``block``."""
        return self._refcount[require_index("block", block, 0, self._num_blocks - 1)]

    def refcounts(self) -> tuple[int, ...]:
        """Refcount of every physical block, by block id (a copy)."""
        return tuple(self._refcount)

    def is_free(self, block: int) -> bool:
        """Whether physical block ``block`` is on the free list."""
        return require_index("block", block, 0, self._num_blocks - 1) in self._free

    def has_sequence(self, seq_id: Hashable) -> bool:
        """True while ``seq_id`` has a block table (allocated and not yet freed)."""
        return seq_id in self._seqs

    def reserved_blocks(self, seq_id: Hashable) -> int:
        """Blocks still reserved for ``seq_id`` (0 when it holds no reservation)."""
        return self._reserved.get(seq_id, 0)

    def sequence_blocks(self) -> dict[Hashable, SequenceBlocks]:
        """Sequence id -> a copy of its record, for every sequence holding a block table."""
        return {
            seq_id: SequenceBlocks(
                tuple(seq.table),
                seq.num_tokens,
                self._reserved.get(seq_id, 0),
                None if seq.tail is None else len(seq.tail),
                len(seq.full_keys),
                seq.num_published,
            )
            for seq_id, seq in self._seqs.items()
        }

    def reservations(self) -> Mapping[Hashable, int]:
        """Sequence id -> blocks reserved for it (a read-only view)."""
        return MappingProxyType(self._reserved)

    def prefix_cache(self) -> Mapping[bytes, int]:
        """Chain key -> physical block registered under it (a read-only view)."""
        return MappingProxyType(self._cache)

    def block_keys(self) -> Mapping[int, bytes]:
        """Physical block -> the chain key it is registered under (a read-only view)."""
        return MappingProxyType(self._key_of)

    def inspect(self) -> BlockPoolView:
        """A read-only view of this pool: sharing counts, owners, ``snapshot``,
        ``check_invariants``."""
        return BlockPoolView(self)

    def can_append(self, seq_id: Hashable, num_tokens: int) -> bool:
        """True when ``append_tokens`` with ``num_tokens`` tokens would succeed for ``seq_id`` right
        now."""
        num_tokens = require_index("num_tokens", num_tokens, 1)
        return self._shortfall(seq_id, self._append_need(self._seq(seq_id), num_tokens)) == 0

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Give ``child_id`` a block table sharing every block of ``parent_id`` (each refcount + 1).

        The child inherits the parent's allocated slots, token ids and namespace, but no
        reservation. A later write into a shared, partially filled tail triggers copy-on-write in
        ``append_tokens``.
        """
        parent = self._seq(parent_id)
        self._check_new(child_id, "child_id")
        for block in parent.table:
            self._incref(block)
        self._seqs[child_id] = _BlockTable(list(parent.table), parent.num_tokens, parent.namespace,
                                           None if parent.tail is None else list(parent.tail),
                                           list(parent.full_keys), parent.num_published)

    def restore(self, seq_id: Hashable, num_tokens: int, token_ids: Sequence[int] | None = None,
                namespace: str = "") -> list[int]:
        """Fresh blocks (no prefix matching) for a sequence swapped back in; returns its block
        table.

        With ``token_ids`` (exactly ``num_tokens``) its full blocks feed the prefix cache, without
        them never. Raises OutOfBlocks with nothing changed when the pool cannot supply the blocks.
        """
        self._check_new(seq_id)
        num_tokens = require_index("num_tokens", num_tokens, 1)
        namespace = require_type("namespace", namespace, str)
        tokens = None
        if token_ids is not None:
            tokens = require_indices("token_ids", token_ids, 0, allow_empty=False)
            if len(tokens) != num_tokens:
                raise ValueError(
                    f"token_ids must hold exactly num_tokens={num_tokens} ids, got {len(tokens)}"
                )
        needed = blocks_for(num_tokens, self._block_size)
        self._ensure_can_take(seq_id, needed)
        table = [self._take_fresh(seq_id) for _ in range(needed)]
        seq = self._seqs[seq_id] = _BlockTable(
            table, 0, namespace, [] if tokens is not None else None, []
        )
        if tokens is None:
            seq.num_tokens = num_tokens  # ids unknown: its tail stays None, it feeds no cache
        else:
            self._fill(seq, tokens)
        return list(table)

    def truncate(self, seq_id: Hashable, num_tokens: int, tail_ids: Sequence[int]) -> int:
        """Roll the sequence's allocated slots back to its first ``num_tokens`` (the KV of rejected
        draft tokens): blocks past the last kept slot are released, and so are the chain keys of
        blocks that filled with rejected ids. ``tail_ids``: the kept ids of the partly filled last
        block (``num_tokens % block_size`` of them). Blocks already offered to the prefix cache stay
        (a rollback never reaches below the computed slots). Returns how many blocks went back to
        the free list."""
        seq = self._seq(seq_id)
        if not seq.num_published * self._block_size <= num_tokens <= seq.num_tokens:
            raise ValueError(
                f"num_tokens must be in [{seq.num_published * self._block_size}, {seq.num_tokens}] "
                f"(published .. allocated slots of {seq_id!r}), got {num_tokens}"
            )
        tail = require_indices("tail_ids", tail_ids, 0)
        if len(tail) != num_tokens % self._block_size:
            raise ValueError(
                f"tail_ids must hold num_tokens % block_size = "
                f"{num_tokens % self._block_size} ids, "
                f"got {len(tail)}"
            )
        keep = blocks_for(num_tokens, self._block_size)
        dropped, seq.table = seq.table[keep:], seq.table[:keep]
        del seq.full_keys[num_tokens // self._block_size:]
        seq.num_tokens = num_tokens
        if seq.tail is not None:
            seq.tail = list(tail)
        return sum(self._decref(block) for block in reversed(dropped))
