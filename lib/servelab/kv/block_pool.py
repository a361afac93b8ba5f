"""The step's part of the paged KV block allocator: block tables, free list, refcounts,
reservations, prefix hits and copy-on-write; ``servelab.kv.allocator.BlockAllocator`` adds what no
default step calls.

A fixed pool of ``num_blocks`` physical blocks of ``block_size`` token slots is handed out through
per-sequence *block tables*; shared blocks carry a refcount; full blocks enter a prefix cache keyed
by their exact token prefix. No tensors: it returns block ids and ``BlockCopy`` instructions; the
engine moves the bytes and tracks how many tokens it has computed. Units are blocks or token slots.
Arguments are checked where a table is created (``allocate_prompt``, ``reserve``); per-chunk calls
trust the scheduler.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from servelab._validate import require_id, require_index, require_indices, require_type
from servelab.kv.arithmetic import blocks_for
from servelab.kv.prefix_cache import match_blocks, prefix_block_key

__all__ = ["OutOfBlocks", "DoubleFreeError", "BlockCopy", "PromptAllocation", "BlockPool"]


class OutOfBlocks(RuntimeError):
    """An allocation needs more blocks than the pool can give without breaking others' reservations;
    raised before anything changes."""


class DoubleFreeError(RuntimeError):
    """A block's refcount would drop below zero: some holder released it twice. Always a bug."""


@dataclass(frozen=True)
class BlockCopy:
    """Copy-on-write instruction: copy every slot of physical block ``src`` into ``dst``, before the
    next KV write or allocating call (``src`` may be a free cached block that a later allocation
    reuses)."""

    src: int
    dst: int


@dataclass(frozen=True)
class PromptAllocation:
    """Result of ``allocate_prompt``: ``cached_prompt_tokens`` prompt tokens already have KV (a
    prefix hit, full blocks, at most ``len(prompt) - 1``); apply ``copies`` before computing the
    rest."""

    cached_prompt_tokens: int
    copies: tuple[BlockCopy, ...]


@dataclass
class _BlockTable:
    """One sequence's block ids and the chain keys of its full blocks. ``tail``: the ids in the
    partly filled last block (its key needs them once it fills; None: ids unknown, the sequence
    feeds no cache); ``full_keys[:num_published]`` have been offered to the prefix cache."""

    table: list[int]
    num_tokens: int
    namespace: str
    tail: list[int] | None
    full_keys: list[bytes]
    num_published: int = 0


@dataclass(frozen=True)
class _PromptPlan:
    """What ``allocate_prompt`` will do, computed without side effects."""

    shared: list[int]
    revived: set[int]
    fresh: int
    cow_src: int | None
    cached_tokens: int


class BlockPool:
    """Paged KV block manager, the step's part (``BlockAllocator`` is the full class: use that one).
    *Allocated slots* (``num_tokens``) have a physical slot in the sequence's block table (how many
    are computed is the engine's business). *Free* blocks have refcount 0; *cached* free ones still
    hold a registered full block a prefix hit can revive until reused (uncached first, then least
    recently freed). A *reservation* only lowers ``num_available_blocks``: its sequence's
    allocations consume it first, everyone else's use the unreserved headroom. A full block enters
    the prefix cache once allocated, or once ``mark_computed`` reports it with
    ``cache_on_compute=True`` (chunked prefill: never hit an unwritten block). Every mutating method
    succeeds completely or raises, changing nothing."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, *,
                 cache_on_compute: bool = False) -> None:
        self._num_blocks = require_index("num_blocks", num_blocks, 1)
        self._block_size = require_index("block_size", block_size, 1)
        self._caching = require_type("enable_prefix_caching", enable_prefix_caching, bool)
        self._cache_on_compute = require_type("cache_on_compute", cache_on_compute, bool)
        self._refcount = [0] * self._num_blocks
        # free list: front = next to reuse (uncached first, then least recently freed cached blocks)
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(self._num_blocks))
        self._cache: dict[bytes, int] = {}  # chain key -> physical block
        self._key_of: dict[int, bytes] = {}  # physical block -> its registered chain key
        self._seqs: dict[Hashable, _BlockTable] = {}
        self._reserved: dict[Hashable, int] = {}
        self._total_reserved = 0

    # ------------------------------------------------------------------ what the step reads
    @property
    def num_available_blocks(self) -> int:
        """Free blocks not promised to any reservation: headroom for new reservations or
        allocations."""
        return len(self._free) - self._total_reserved

    def block_table(self, seq_id: Hashable) -> list[int]:
        """Copy of the sequence's block table: entry ``i`` is the physical block of logical block
        ``i``."""
        return list(self._seq(seq_id).table)

    def num_tokens(self, seq_id: Hashable) -> int:
        """Token slots allocated to the sequence (not necessarily computed yet)."""
        return self._seq(seq_id).num_tokens

    # ------------------------------------------------------------------ reservations
    def reserve(self, seq_id: Hashable, num_blocks: int) -> bool:
        """Promise ``num_blocks`` future blocks to ``seq_id`` (bookkeeping only, added to any
        earlier promise; the free list is untouched). False, nothing changed, when the headroom is
        smaller."""
        require_id("seq_id", seq_id)
        num_blocks = require_index("num_blocks", num_blocks, 0)
        if num_blocks > self.num_available_blocks:
            return False
        if num_blocks:
            self._reserved[seq_id] = self._reserved.get(seq_id, 0) + num_blocks
            self._total_reserved += num_blocks
        return True

    def release_reservation(self, seq_id: Hashable) -> int:
        """Drop whatever is still reserved for ``seq_id``; returns how many blocks that was (0 if
        none)."""
        released = self._reserved.pop(seq_id, 0)
        self._total_reserved -= released
        return released

    # ------------------------------------------------------------------ allocation
    def num_blocks_to_allocate(self, token_ids: Sequence[int], namespace: str = "") -> int:
        """Free blocks ``allocate_prompt`` needs (fresh + revived, plus a free cached copy-on-write
        source that must stay unreused until copied): a reservation of this many guarantees it
        succeeds."""
        plan = self._plan_prompt(token_ids, namespace)
        held_source = plan.cow_src is not None and self._refcount[plan.cow_src] == 0
        return plan.fresh + len(plan.revived) + (1 if held_source else 0)

    def allocate_prompt(
        self, seq_id: Hashable, token_ids: Sequence[int], namespace: str = ""
    ) -> PromptAllocation:
        """Create ``seq_id``'s block table with slots for the whole prompt, sharing cached prefix
        blocks (refcount + 1, reviving free ones). ``cached_prompt_tokens`` is capped at
        ``len(token_ids) - 1``; when the cap falls inside the last matched block, that block is
        copied on write. Fresh blocks come from the reservation first. ValueError if ``seq_id`` has
        a table, OutOfBlocks (nothing changed) if the pool is short."""
        self._check_new(seq_id)
        tokens = require_indices("token_ids", token_ids, 0, allow_empty=False)
        namespace = require_type("namespace", namespace, str)
        plan = self._plan_prompt(tokens, namespace)
        self._ensure_can_take(seq_id, plan.fresh + len(plan.revived), plan.cow_src)
        table: list[int] = []
        for block in plan.shared:
            self._incref(block)
            self._consume_reservation(seq_id, 1 if block in plan.revived else 0)
            table.append(block)
        copies: tuple[BlockCopy, ...] = ()
        if plan.cow_src is not None:
            dst = self._take_fresh(seq_id, exclude=plan.cow_src)
            copies = (BlockCopy(plan.cow_src, dst),)
            table.append(dst)
        while len(table) < blocks_for(len(tokens), self._block_size):
            table.append(self._take_fresh(seq_id))
        seq = self._seqs[seq_id] = _BlockTable(table, 0, namespace, [], [])
        self._fill(seq, tokens)
        return PromptAllocation(plan.cached_tokens, copies)

    def append_tokens(self, seq_id: Hashable, token_ids: Sequence[int]) -> tuple[BlockCopy, ...]:
        """Slots for more tokens of the sequence (a prefill chunk or a decode token): a shared,
        partly filled tail is copied on write first (``BlockCopy`` returned), new blocks come from
        the reservation first. OutOfBlocks, nothing changed, when the pool cannot supply them."""
        seq = self._seq(seq_id)
        tokens = token_ids
        self._ensure_can_take(seq_id, self._append_need(seq, len(tokens)))
        copies: tuple[BlockCopy, ...] = ()
        if self._tail_needs_cow(seq):
            src = seq.table[-1]
            dst = self._take_fresh(seq_id)
            self._decref(src)
            seq.table[-1] = dst
            copies = (BlockCopy(src, dst),)
        while len(seq.table) < blocks_for(seq.num_tokens + len(tokens), self._block_size):
            seq.table.append(self._take_fresh(seq_id))
        self._fill(seq, tokens)
        return copies

    def mark_computed(self, seq_id: Hashable, num_computed_tokens: int) -> int:
        """The engine has written KV for the first ``num_computed_tokens`` slots: publish the full
        blocks in that range to the prefix cache (deferred under ``cache_on_compute``). Returns how
        many entered."""
        seq = self._seq(seq_id)
        if not 0 <= num_computed_tokens <= seq.num_tokens:
            raise ValueError(
                f"num_computed_tokens (allocated slots of {seq_id!r}) must be in [0, "
                f"{seq.num_tokens}],"
                f" got {num_computed_tokens}"
            )
        upto = min(num_computed_tokens // self._block_size, len(seq.full_keys))
        return self._publish(seq, upto) if upto > seq.num_published else 0

    def free(self, seq_id: Hashable) -> int:
        """Release ``seq_id``: decref every block of its table (tail first) and drop its
        reservation. Returns how many blocks went back to the free list (a shared block only with
        its last holder).
        Idempotent: an unknown or already freed ``seq_id`` returns 0."""
        self.release_reservation(seq_id)
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return 0
        return sum(self._decref(block) for block in reversed(seq.table))

    # ------------------------------------------------------------------ internals: planning
    def _seq(self, seq_id: Hashable) -> _BlockTable:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise ValueError(f"seq_id {seq_id!r} has no block table") from None

    def _check_new(self, seq_id: Hashable, name: str = "seq_id") -> None:
        require_id(name, seq_id)
        if seq_id in self._seqs:
            raise ValueError(f"{name} {seq_id!r} already has a block table; free it first")

    def _match(self, tokens: tuple[int, ...], namespace: str) -> list[int]:
        """Physical blocks of the longest run of leading full blocks found in the prefix cache."""
        return (
            match_blocks(self._cache, tokens, self._block_size, namespace) if self._caching else []
        )

    def _plan_prompt(self, tokens: tuple[int, ...], namespace: str) -> _PromptPlan:
        matched = self._match(tokens, namespace)
        cached_tokens = min(len(matched) * self._block_size, len(tokens) - 1)
        cow_src = None
        if matched and cached_tokens < len(matched) * self._block_size:
            cow_src = matched.pop()  # the cap falls inside the last matched block
        revived = {b for b in matched if self._refcount[b] == 0}
        fresh = blocks_for(len(tokens), self._block_size) - len(matched)
        return _PromptPlan(matched, revived, fresh, cow_src, cached_tokens)

    def _append_need(self, seq: _BlockTable, num_tokens: int) -> int:
        """Blocks an append of ``num_tokens`` takes off the free list (new blocks + a
        copy-on-write)."""
        new_blocks = blocks_for(seq.num_tokens + num_tokens, self._block_size) - len(seq.table)
        return new_blocks + (1 if self._tail_needs_cow(seq) else 0)

    def _tail_needs_cow(self, seq: _BlockTable) -> bool:
        """The tail block is shared and has free slots, so writing into it must copy it first."""
        return (
            bool(seq.table)
            and seq.num_tokens % self._block_size != 0
            and self._refcount[seq.table[-1]] > 1
        )

    def _shortfall(self, seq_id: Hashable, taken: int, exclude: int | None = None) -> int:
        """How many blocks short the pool is for taking ``taken`` blocks off the free list for
        ``seq_id``. ``exclude`` is a free block that must stay on the list (the source of a pending
        copy)."""
        own = self._reserved.get(seq_id, 0)
        headroom_short = max(0, taken - min(taken, own) - self.num_available_blocks)
        usable = len(self._free) - (
            1 if exclude is not None and self._refcount[exclude] == 0 else 0
        )
        return max(headroom_short, taken - usable, 0)

    def _ensure_can_take(self, seq_id: Hashable, taken: int, exclude: int | None = None) -> None:
        short = self._shortfall(seq_id, taken, exclude)
        if short:
            raise OutOfBlocks(
                f"seq_id {seq_id!r} needs {taken} blocks from the pool: {len(self._free)} free, "
                f"{self.num_available_blocks} unreserved, {self._reserved.get(seq_id, 0)} reserved "
                f"for it; short by {short}"
            )

    # ------------------------------------------------------------------ internals: mutation
    def _consume_reservation(self, seq_id: Hashable, blocks: int) -> None:
        own = self._reserved.get(seq_id, 0)
        used = min(own, blocks)
        if used:
            self._total_reserved -= used
            self._reserved[seq_id] = own - used
            if used == own:
                del self._reserved[seq_id]

    def _take_fresh(self, seq_id: Hashable, exclude: int | None = None) -> int:
        """Pop the next reusable free block (evicting its cache entry) and give it refcount 1."""
        held_back = exclude is not None and exclude in self._free
        if held_back:
            del self._free[exclude]
        block, _ = self._free.popitem(last=False)
        if held_back:
            self._free[exclude] = None  # back at the most-recently-used end: it was just hit
        key = self._key_of.pop(block, None)
        if key is not None:
            del self._cache[key]
        self._refcount[block] = 1
        self._consume_reservation(seq_id, 1)
        return block

    def _incref(self, block: int) -> None:
        if self._refcount[block] == 0:
            del self._free[block]
        self._refcount[block] += 1

    def _decref(self, block: int) -> int:
        """Drop one reference; returns 1 if the block went back to the free list, else 0."""
        if self._refcount[block] <= 0:
            raise DoubleFreeError(f"block {block} released with refcount {self._refcount[block]}")
        self._refcount[block] -= 1
        if self._refcount[block]:
            return 0
        self._free[block] = None
        if block not in self._key_of:
            self._free.move_to_end(block, last=False)  # holds nothing reusable: hand it out first
        return 1

    def _fill(self, seq: _BlockTable, tokens: Sequence[int]) -> None:
        """Record tokens written into already-allocated slots; register blocks that became full."""
        seq.num_tokens += len(tokens)
        if seq.tail is None:  # ids unknown (restored without them): this sequence feeds no cache
            return
        pending = seq.tail + list(tokens)
        full = len(pending) // self._block_size * self._block_size
        for lo in range(0, full, self._block_size):
            self._register_full(seq, pending[lo:lo + self._block_size])
        seq.tail = pending[full:]

    def _register_full(self, seq: _BlockTable, block_tokens: list[int]) -> None:
        """Extend the sequence's key chain by the block that ``block_tokens`` just filled; publish
        it unless deferred."""
        parent = seq.full_keys[-1] if seq.full_keys else None
        seq.full_keys.append(prefix_block_key(parent, block_tokens, seq.namespace))
        if not self._cache_on_compute:
            self._publish(seq, len(seq.full_keys))

    def _publish(self, seq: _BlockTable, upto: int) -> int:
        """Offer full blocks ``[num_published, upto)`` to the prefix cache; returns how many were
        cached. A block is cached only if no other block already holds its key (the first copy
        stays)."""
        cached = 0
        for i in range(seq.num_published, upto):
            key, block = seq.full_keys[i], seq.table[i]
            if self._caching and key not in self._cache and block not in self._key_of:
                self._cache[key] = block
                self._key_of[block] = key
                cached += 1
        seq.num_published = max(seq.num_published, upto)
        return cached
