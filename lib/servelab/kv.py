"""KV-cache bytes and paged block accounting.

Two halves live here.

*Arithmetic.* How many bytes one token of KV cache costs (``kv_bytes_per_token``), how many token slots a
block allocator hands out for a set of sequences (``block_alloc_slots``: the gap between logical and
allocated slots is internal fragmentation), how many physical blocks those sequences need with and
without prefix sharing, and how KV heads split across tensor-parallel ranks.

*Bookkeeping.* ``BlockAllocator`` is the paged-KV block manager the whole course uses. A fixed pool of
``num_blocks`` physical blocks, each holding ``block_size`` token slots, is handed out to sequences
through per-sequence *block tables* (logical block ``i`` -> physical block id). Blocks carry a
*refcount* so that a common prompt prefix or the branches of a fork share one physical copy; writing
into a shared, partially filled block triggers *copy-on-write*. Full blocks are registered in a
*prefix cache* keyed by the exact token sequence that produced them, and stay there after their last
holder frees them until the pool needs the slot (least recently freed first).

System boundary: the allocator holds no tensors and computes nothing. It returns block ids and
``BlockCopy`` instructions; the engine moves the bytes, runs attention through the block table, and
tracks how many tokens of each sequence it has actually computed. Every unit below is a block or a
token slot unless a name says bytes.
"""

from __future__ import annotations

import hashlib
import operator
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "kv_bytes_per_token",
    "block_alloc_slots",
    "physical_blocks_no_sharing",
    "physical_blocks_with_sharing",
    "kv_heads_per_tp_rank",
    "prefix_block_key",
    "OutOfBlocks",
    "DoubleFreeError",
    "BlockCopy",
    "PromptAllocation",
    "BlockAllocator",
]


# ----------------------------------------------------------------------------------------------------
# argument checks shared by the module
# ----------------------------------------------------------------------------------------------------


def _as_int(value: object, name: str, minimum: int) -> int:
    """Return ``value`` as a Python int, or raise TypeError/ValueError naming ``name``."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer >= {minimum}, got bool {value!r}")
    try:
        as_int = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an integer >= {minimum}, got {type(value).__name__}"
        ) from None
    if as_int < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {as_int}")
    return as_int


def _as_lengths(lengths: Iterable[int], name: str) -> list[int]:
    """Return a list of non-negative token counts, validating every entry."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        raise TypeError(f"{name} must be an iterable of integers >= 0")
    return [_as_int(length, f"{name}[{i}]", 0) for i, length in enumerate(lengths)]


def _as_tokens(token_ids: Sequence[int], name: str, allow_empty: bool = False) -> tuple[int, ...]:
    """Return token ids as a tuple of ints >= 0; an empty sequence is allowed only on request."""
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Iterable):
        raise TypeError(f"{name} must be a sequence of integer token ids >= 0")
    tokens = tuple(_as_int(t, f"{name}[{i}]", 0) for i, t in enumerate(token_ids))
    if not tokens and not allow_empty:
        raise ValueError(f"{name} must hold at least 1 token id, got an empty sequence")
    return tokens


def _blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` slots (ceiling division)."""
    return -(-num_tokens // block_size)


# ----------------------------------------------------------------------------------------------------
# arithmetic
# ----------------------------------------------------------------------------------------------------


def kv_bytes_per_token(n_layer: int, n_kv_head: int, d_head: int, bytes_per_elem: int) -> int:
    """Bytes of KV cache one token occupies: ``2 * n_layer * n_kv_head * d_head * bytes_per_elem``.

    The 2 counts K and V. ``n_kv_head`` is the number of *KV* heads (fewer than the query heads under
    GQA/MQA); passing the query-head count overstates the cost by the grouping factor. This is the
    ideal payload: block-table metadata, alignment and quantization scales are not included.

    >>> kv_bytes_per_token(2, 2, 4, 2)
    64
    """
    n_layer = _as_int(n_layer, "n_layer", 1)
    n_kv_head = _as_int(n_kv_head, "n_kv_head", 1)
    d_head = _as_int(d_head, "d_head", 1)
    bytes_per_elem = _as_int(bytes_per_elem, "bytes_per_elem", 1)
    return 2 * n_layer * n_kv_head * d_head * bytes_per_elem


def block_alloc_slots(lengths: Iterable[int], block_size: int) -> tuple[int, int]:
    """Return ``(logical_slots, allocated_slots)`` for sequences of the given token lengths.

    Logical slots are the tokens actually stored; allocated slots are whole blocks, so every sequence
    rounds up to a multiple of ``block_size``. The difference is internal fragmentation, which lives
    only in each sequence's last block.

    >>> block_alloc_slots([1, 5], 4)
    (6, 12)
    """
    lengths = _as_lengths(lengths, "lengths")
    block_size = _as_int(block_size, "block_size", 1)
    allocated = sum(_blocks_for(n, block_size) for n in lengths) * block_size
    return sum(lengths), allocated


def physical_blocks_no_sharing(lengths: Iterable[int], block_size: int) -> int:
    """Physical blocks for sequences that share nothing: the sum of each one's ``ceil(len / block_size)``.

    >>> physical_blocks_no_sharing([6, 7], 4)
    4
    """
    lengths = _as_lengths(lengths, "lengths")
    block_size = _as_int(block_size, "block_size", 1)
    return sum(_blocks_for(n, block_size) for n in lengths)


def prefix_block_key(parent_key: bytes | None, block_tokens: Sequence[int], namespace: str = "") -> bytes:
    """Content key of one full KV block: a SHA-256 chain over namespace, parent key and the block's tokens.

    Two blocks get the same key exactly when their whole token prefix (every earlier block and this
    one) is identical *and* the namespace matches, because the parent key already encodes everything
    before. The namespace is the tenant/model/adapter salt: equal tokens under different namespaces
    never share a key. ``parent_key`` is ``None`` for the first block of a sequence.
    """
    if parent_key is not None and not isinstance(parent_key, bytes):
        raise TypeError(f"parent_key must be bytes or None, got {type(parent_key).__name__}")
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, got {type(namespace).__name__}")
    tokens = _as_tokens(block_tokens, "block_tokens")
    digest = hashlib.sha256()
    digest.update(namespace.encode("utf-8"))
    digest.update(b"\x00")
    digest.update(parent_key if parent_key is not None else b"<root>")
    digest.update(b"\x00")
    digest.update(",".join(map(str, tokens)).encode("ascii"))
    return digest.digest()


def _full_block_keys(tokens: Sequence[int], block_size: int, namespace: str) -> list[bytes]:
    """Chain keys of every *full* block of ``tokens``; a partial tail block gets no key."""
    keys: list[bytes] = []
    parent: bytes | None = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = prefix_block_key(parent, tokens[start : start + block_size], namespace)
        keys.append(parent)
    return keys


def physical_blocks_with_sharing(token_sequences: Iterable[Sequence[int]], block_size: int) -> int:
    """Physical blocks for sequences that share full blocks whose entire token prefix matches exactly.

    A full block is shared when every token up to and including that block is identical (same chain
    key); a partially filled tail block is always private. An overlap shorter than one block therefore
    shares nothing, and ``n`` sequences with ``B_shared`` common full blocks save ``(n - 1) * B_shared``
    blocks compared with ``physical_blocks_no_sharing``.

    >>> physical_blocks_with_sharing([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8, 9]], 4)
    3
    """
    if isinstance(token_sequences, (str, bytes)) or not isinstance(token_sequences, Iterable):
        raise TypeError("token_sequences must be an iterable of token-id sequences")
    block_size = _as_int(block_size, "block_size", 1)
    distinct_full: set[bytes] = set()
    partial_tails = 0
    for i, seq in enumerate(token_sequences):
        tokens = _as_tokens(seq, f"token_sequences[{i}]", allow_empty=True)
        distinct_full.update(_full_block_keys(tokens, block_size, ""))
        partial_tails += 1 if len(tokens) % block_size else 0
    return len(distinct_full) + partial_tails


def kv_heads_per_tp_rank(n_kv_heads: int, tp_degree: int) -> int:
    """KV heads each tensor-parallel rank stores when heads are split evenly: ``n_kv_heads / tp_degree``.

    Raises ValueError when the split is not even (for example 8 KV heads over TP=3, or 4 KV heads over
    TP=8): such a layout needs KV-head replication or a different sharding, not a plain division.

    >>> kv_heads_per_tp_rank(8, 4)
    2
    """
    n_kv_heads = _as_int(n_kv_heads, "n_kv_heads", 1)
    tp_degree = _as_int(tp_degree, "tp_degree", 1)
    if n_kv_heads % tp_degree:
        raise ValueError(
            f"n_kv_heads={n_kv_heads} is not divisible by tp_degree={tp_degree}: the KV heads cannot be "
            "split evenly across ranks; replicate KV heads (when tp_degree > n_kv_heads) or use another "
            "sharding instead of dividing"
        )
    return n_kv_heads // tp_degree


# ----------------------------------------------------------------------------------------------------
# the block allocator
# ----------------------------------------------------------------------------------------------------


class OutOfBlocks(RuntimeError):
    """An allocation needs more blocks than the pool can give without breaking others' reservations.

    Raised before anything changes: the allocator is exactly as it was before the call.
    """


class DoubleFreeError(RuntimeError):
    """A block's refcount would drop below zero: some holder released it twice. Always a bug."""


@dataclass(frozen=True)
class BlockCopy:
    """Copy-on-write instruction for the engine: copy every slot of physical block ``src`` into ``dst``.

    The engine must perform the copy before it next writes KV or calls an allocating method, because
    ``src`` may be a free cached block that a later allocation is allowed to reuse.
    """

    src: int
    dst: int


@dataclass(frozen=True)
class PromptAllocation:
    """Result of ``BlockAllocator.allocate_prompt``.

    ``num_cached_tokens`` prompt tokens already have valid KV in the sequence's blocks (prefix-cache
    hit, full blocks only, at most ``len(prompt) - 1``); the engine computes the rest. ``copies`` must
    be applied before that computation.
    """

    num_cached_tokens: int
    copies: tuple[BlockCopy, ...]


@dataclass
class _Sequence:
    """Per-sequence bookkeeping.

    ``tokens`` is None when the token ids are unknown (restore without ids). ``full_keys[i]`` is the
    chain key of full block ``i``; the first ``num_published`` of them have been offered to the cache.
    """

    table: list[int]
    num_tokens: int
    namespace: str
    tokens: list[int] | None
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


class BlockAllocator:
    """Paged KV block manager: block tables, refcounts, reservations, copy-on-write and a prefix cache.

    Vocabulary used by every method:

    * *allocated slots* of a sequence (``num_tokens``): token positions that have a physical slot in
      its block table. ``allocate_prompt`` allocates the whole prompt; ``append_tokens`` allocates more.
      How many of those slots the engine has actually *computed* is the engine's business.
    * *free* blocks have refcount 0. Some of them are *cached*: they still hold a registered full block
      and can be revived by a prefix hit until the pool reuses them (uncached free blocks are reused
      first, then cached ones, least recently freed first).
    * a *reservation* is bookkeeping only: it promises a sequence future blocks by lowering
      ``num_available_blocks`` without touching the free list. Allocations for that sequence consume
      its reservation first; allocations for everyone else may only use the unreserved headroom.

    *When* a full block enters the prefix cache: by default as soon as its slots are allocated
    (``allocate_prompt`` / ``append_tokens`` / ``restore``), which is only safe when the engine
    computes a block before any other sequence's forward pass can read it. Under chunked prefill a
    second request could hit prompt blocks that are allocated but not yet written, and a request
    cancelled mid-prefill would leave unwritten blocks in the cache. With ``cache_on_compute=True``
    full blocks are published only when the engine reports them computed through ``mark_computed``.

    Every mutating method either succeeds completely or raises and changes nothing.

    >>> alloc = BlockAllocator(num_blocks=8, block_size=4)
    >>> alloc.reserve("a", 3)  # admission: bookkeeping only
    True
    >>> alloc.allocate_prompt("a", [1, 2, 3, 4, 5, 6])  # a tick picks it: 2 blocks from the reservation
    PromptAllocation(num_cached_tokens=0, copies=())
    >>> alloc.append_tokens("a", [7])  # a slot for the next token's KV; fits the tail block
    ()
    >>> alloc.allocate_prompt("b", [1, 2, 3, 4, 9]).num_cached_tokens  # first block is a prefix hit
    4
    >>> alloc.refcount(alloc.block_table("a")[0]), alloc.num_used_blocks, alloc.num_reserved_blocks
    (2, 3, 1)
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        *,
        cache_on_compute: bool = False,
    ) -> None:
        self._num_blocks = _as_int(num_blocks, "num_blocks", 1)
        self._block_size = _as_int(block_size, "block_size", 1)
        for name, flag in (
            ("enable_prefix_caching", enable_prefix_caching),
            ("cache_on_compute", cache_on_compute),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        self._caching = enable_prefix_caching
        self._cache_on_compute = cache_on_compute
        self._refcount = [0] * self._num_blocks
        self._num_filled = [0] * self._num_blocks
        # free list: front = next to reuse (uncached first, then least recently freed cached blocks)
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(self._num_blocks))
        self._cache: dict[bytes, int] = {}  # chain key -> physical block
        self._key_of: dict[int, bytes] = {}  # physical block -> its registered chain key
        self._seqs: dict[Hashable, _Sequence] = {}
        self._reserved: dict[Hashable, int] = {}
        self._total_reserved = 0

    # ------------------------------------------------------------------ read-only views

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
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a registered full block (evictable prefix-cache entries)."""
        return sum(1 for b in self._key_of if self._refcount[b] == 0)

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks promised by reservations and not yet physically allocated."""
        return self._total_reserved

    @property
    def num_available_blocks(self) -> int:
        """Free blocks not promised to any reservation: headroom for new reservations or allocations."""
        return len(self._free) - self._total_reserved

    def refcount(self, block: int) -> int:
        """Number of block-table references to physical block ``block``."""
        return self._refcount[self._check_block(block)]

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

    # ------------------------------------------------------------------ reservations

    def reserve(self, seq_id: Hashable, num_blocks: int) -> bool:
        """Promise ``num_blocks`` future blocks to ``seq_id`` (bookkeeping only; adds to any earlier one).

        Returns False and changes nothing when ``num_available_blocks`` is smaller than ``num_blocks``.
        The free list is untouched: ``num_free_blocks`` stays, ``num_available_blocks`` drops.
        """
        self._check_seq_id(seq_id)
        num_blocks = _as_int(num_blocks, "num_blocks", 0)
        if num_blocks > self.num_available_blocks:
            return False
        if num_blocks:
            self._reserved[seq_id] = self._reserved.get(seq_id, 0) + num_blocks
            self._total_reserved += num_blocks
        return True

    def release_reservation(self, seq_id: Hashable) -> int:
        """Drop whatever is still reserved for ``seq_id``; returns how many blocks that was (0 if none)."""
        released = self._reserved.pop(seq_id, 0)
        self._total_reserved -= released
        return released

    # ------------------------------------------------------------------ prefix lookup

    def lookup_prefix(self, token_ids: Sequence[int], namespace: str = "") -> int:
        """Prompt tokens a prefix hit would supply: the ``num_cached_tokens`` ``allocate_prompt`` would report.

        Only whole blocks match, and the count is capped at ``len(token_ids) - 1`` because the last
        prompt token must be computed to get logits for the first sampled token. No side effects.
        """
        tokens = _as_tokens(token_ids, "token_ids")
        matched = self._match(tokens, self._check_namespace(namespace))
        return min(len(matched) * self._block_size, len(tokens) - 1)

    def num_blocks_to_allocate(self, token_ids: Sequence[int], namespace: str = "") -> int:
        """Free blocks ``allocate_prompt`` needs for this prompt: the ones it takes off the free list
        (fresh + revived), plus a free cached copy-on-write source, which must stay on the free list
        (unreused) until the engine has copied it.

        Useful for admission: a reservation of this many blocks guarantees ``allocate_prompt`` succeeds.
        No side effects.
        """
        tokens = _as_tokens(token_ids, "token_ids")
        plan = self._plan_prompt(tokens, self._check_namespace(namespace))
        held_source = plan.cow_src is not None and self._refcount[plan.cow_src] == 0
        return plan.fresh + len(plan.revived) + (1 if held_source else 0)

    # ------------------------------------------------------------------ allocation

    def allocate_prompt(
        self, seq_id: Hashable, token_ids: Sequence[int], namespace: str = ""
    ) -> PromptAllocation:
        """Create ``seq_id``'s block table with slots for the whole prompt, reusing cached prefix blocks.

        Full prompt blocks whose chain key (namespace + previous key + exact tokens) is in the prefix
        cache are shared (refcount + 1, reviving cached free blocks). ``num_cached_tokens`` is capped at
        ``len(token_ids) - 1``; when that cap falls inside the last matched block, the block is
        copied-on-write into a private block (``BlockCopy`` returned) so the engine can recompute the
        last token there. Other blocks are fresh, taken from the sequence's reservation first and then
        from unreserved headroom. Every full prompt block is then registered in the prefix cache (with
        ``cache_on_compute``, once ``mark_computed`` covers it).

        Raises ValueError if ``seq_id`` already has a table, OutOfBlocks (nothing changed) if the pool
        cannot supply the blocks.
        """
        self._check_seq_id(seq_id)
        if seq_id in self._seqs:
            raise ValueError(f"seq_id {seq_id!r} already has a block table; free it first")
        tokens = _as_tokens(token_ids, "token_ids")
        namespace = self._check_namespace(namespace)
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
            self._num_filled[dst] = self._block_size
            copies = (BlockCopy(plan.cow_src, dst),)
            table.append(dst)
        while len(table) < _blocks_for(len(tokens), self._block_size):
            table.append(self._take_fresh(seq_id))
        seq = _Sequence(table, 0, namespace, [], [])
        self._seqs[seq_id] = seq
        self._fill(seq, tokens)
        return PromptAllocation(plan.cached_tokens, copies)

    def can_append(self, seq_id: Hashable, num_tokens: int) -> bool:
        """True when ``append_tokens`` with ``num_tokens`` tokens would succeed for ``seq_id`` right now."""
        num_tokens = _as_int(num_tokens, "num_tokens", 1)
        seq = self._seq(seq_id)
        taken = self._append_need(seq, num_tokens)
        return self._shortfall(seq_id, taken) == 0

    def append_tokens(self, seq_id: Hashable, token_ids: Sequence[int]) -> tuple[BlockCopy, ...]:
        """Allocate slots for tokens past the sequence's allocated slots (a prefill chunk or a decode token).

        If the tail block is shared (refcount > 1) and only partially filled, it is copied-on-write into
        a private block first (returned as a ``BlockCopy``). New blocks come from the sequence's
        reservation first. Every block that becomes full is registered in the prefix cache (with
        ``cache_on_compute``, once ``mark_computed`` covers it). Raises OutOfBlocks with nothing
        changed when the pool cannot supply the blocks.
        """
        seq = self._seq(seq_id)
        tokens = _as_tokens(token_ids, "token_ids")
        taken = self._append_need(seq, len(tokens))
        self._ensure_can_take(seq_id, taken)
        copies: tuple[BlockCopy, ...] = ()
        if self._tail_needs_cow(seq):
            src = seq.table[-1]
            dst = self._take_fresh(seq_id)
            self._num_filled[dst] = self._num_filled[src]
            self._decref(src)
            seq.table[-1] = dst
            copies = (BlockCopy(src, dst),)
        while len(seq.table) < _blocks_for(seq.num_tokens + len(tokens), self._block_size):
            seq.table.append(self._take_fresh(seq_id))
        self._fill(seq, tokens)
        return copies

    def mark_computed(self, seq_id: Hashable, num_computed_tokens: int) -> int:
        """Tell the allocator the engine has written KV for the first ``num_computed_tokens`` slots.

        Publishes every full block inside that range to the prefix cache (it was deferred when the
        allocator was built with ``cache_on_compute=True``; otherwise the blocks are already
        published and this returns 0). Returns how many blocks entered the cache.
        """
        seq = self._seq(seq_id)
        num_computed_tokens = _as_int(num_computed_tokens, "num_computed_tokens", 0)
        if num_computed_tokens > seq.num_tokens:
            raise ValueError(
                f"num_computed_tokens must be in [0, {seq.num_tokens}] (allocated slots of "
                f"{seq_id!r}), got {num_computed_tokens}"
            )
        upto = min(num_computed_tokens // self._block_size, len(seq.full_keys))
        return self._publish(seq, upto) if upto > seq.num_published else 0

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Give ``child_id`` a block table sharing every block of ``parent_id`` (each refcount + 1).

        The child inherits the parent's allocated slots, token ids and namespace, but no reservation.
        A later write into a shared, partially filled tail triggers copy-on-write in ``append_tokens``.
        """
        parent = self._seq(parent_id)
        self._check_seq_id(child_id)
        if child_id in self._seqs:
            raise ValueError(f"child_id {child_id!r} already has a block table")
        for block in parent.table:
            self._incref(block)
        self._seqs[child_id] = _Sequence(
            list(parent.table),
            parent.num_tokens,
            parent.namespace,
            None if parent.tokens is None else list(parent.tokens),
            list(parent.full_keys),
            parent.num_published,
        )

    def restore(
        self,
        seq_id: Hashable,
        num_tokens: int,
        token_ids: Sequence[int] | None = None,
        namespace: str = "",
    ) -> list[int]:
        """Allocate fresh blocks for a sequence swapped back in from host memory; returns its block table.

        The engine copies the saved KV into the returned blocks. No prefix matching happens. With
        ``token_ids`` (exactly ``num_tokens`` of them) full blocks are registered in the prefix cache
        and later appends keep registering; without them the sequence never enters the cache.
        Raises OutOfBlocks with nothing changed when the pool cannot supply the blocks.
        """
        self._check_seq_id(seq_id)
        if seq_id in self._seqs:
            raise ValueError(f"seq_id {seq_id!r} already has a block table; free it first")
        num_tokens = _as_int(num_tokens, "num_tokens", 1)
        namespace = self._check_namespace(namespace)
        tokens = None
        if token_ids is not None:
            tokens = _as_tokens(token_ids, "token_ids")
            if len(tokens) != num_tokens:
                raise ValueError(
                    f"token_ids must hold exactly num_tokens={num_tokens} ids, got {len(tokens)}"
                )
        needed = _blocks_for(num_tokens, self._block_size)
        self._ensure_can_take(seq_id, needed)
        table = [self._take_fresh(seq_id) for _ in range(needed)]
        seq = _Sequence(table, 0, namespace, [] if tokens is not None else None, [])
        self._seqs[seq_id] = seq
        self._fill(seq, tokens if tokens is not None else num_tokens)
        return list(table)

    def free(self, seq_id: Hashable) -> int:
        """Release ``seq_id``: decref every block of its table and drop its reservation.

        Returns how many blocks went back to the free list (a shared block returns only when its last
        holder frees it). Idempotent: an unknown or already freed ``seq_id`` returns 0 and changes
        nothing except dropping a leftover reservation. Blocks are released tail first, so a request's
        deepest prefix blocks are the first cached ones to be reused.
        """
        self.release_reservation(seq_id)
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return 0
        returned = 0
        for block in reversed(seq.table):
            returned += self._decref(block)
        return returned

    # ------------------------------------------------------------------ inspection

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
        blocks = []
        for b in range(self._num_blocks):
            if self._refcount[b] > 0:
                state = "used"
            elif b in self._key_of:
                state = "cached"
            else:
                state = "free"
            blocks.append(
                {
                    "block": b,
                    "refcount": self._refcount[b],
                    "owners": owners.get(b, []),
                    "state": state,
                    "num_filled": self._num_filled[b],
                }
            )
        sequences = {
            seq_id: {
                "block_table": list(seq.table),
                "num_tokens": seq.num_tokens,
                "reserved": self._reserved.get(seq_id, 0),
            }
            for seq_id, seq in self._seqs.items()
        }
        return {
            "num_blocks": self._num_blocks,
            "block_size": self._block_size,
            "num_free_blocks": self.num_free_blocks,
            "num_used_blocks": self.num_used_blocks,
            "num_reserved_blocks": self._total_reserved,
            "num_available_blocks": self.num_available_blocks,
            "blocks": blocks,
            "sequences": sequences,
            "reservations": dict(self._reserved),
        }

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent anywhere.

        Checked: free + used == total; refcount >= 0 and equal to the number of table references;
        refcount 0 exactly for blocks on the free list; reservations positive and their sum equal to
        ``num_reserved_blocks`` and no larger than the free list; every table has
        ``ceil(num_tokens / block_size)`` distinct blocks with matching fill counts; the prefix cache
        and the per-block keys mirror each other and cover only full blocks.
        """
        refs = [0] * self._num_blocks
        for seq_id, seq in self._seqs.items():
            assert len(seq.table) == _blocks_for(seq.num_tokens, self._block_size), (
                f"seq {seq_id!r}: {len(seq.table)} blocks for {seq.num_tokens} tokens"
            )
            assert len(set(seq.table)) == len(seq.table), f"seq {seq_id!r} holds a block twice"
            for i, block in enumerate(seq.table):
                refs[block] += 1
                expected = min(self._block_size, seq.num_tokens - i * self._block_size)
                assert self._num_filled[block] >= expected, (
                    f"block {block} of seq {seq_id!r} holds {self._num_filled[block]} < {expected} slots"
                )
            if seq.tokens is not None:
                assert len(seq.tokens) == seq.num_tokens, f"seq {seq_id!r} token count mismatch"
            assert seq.num_published <= len(seq.full_keys) <= seq.num_tokens // self._block_size
        for block in range(self._num_blocks):
            assert self._refcount[block] >= 0, f"block {block} refcount {self._refcount[block]} < 0"
            assert self._refcount[block] == refs[block], (
                f"block {block}: refcount {self._refcount[block]} but {refs[block]} table references"
            )
            assert (self._refcount[block] == 0) == (block in self._free), (
                f"block {block}: refcount {self._refcount[block]} disagrees with the free list"
            )
        assert len(self._free) + self.num_used_blocks == self._num_blocks
        assert all(n > 0 for n in self._reserved.values()), "empty reservation kept"
        assert sum(self._reserved.values()) == self._total_reserved, "reservation total drifted"
        assert self._total_reserved <= len(self._free), (
            f"{self._total_reserved} blocks reserved but only {len(self._free)} free"
        )
        assert len(self._cache) == len(self._key_of), "prefix cache and block keys disagree"
        for key, block in self._cache.items():
            assert self._key_of.get(block) == key, f"cache entry for block {block} is stale"
            assert self._num_filled[block] == self._block_size, f"cached block {block} is not full"
        assert self._caching or not self._cache, "prefix cache used while disabled"

    # ------------------------------------------------------------------ internals: validation

    @staticmethod
    def _check_seq_id(seq_id: Hashable) -> None:
        if seq_id is None or not isinstance(seq_id, Hashable):
            raise TypeError(f"seq_id must be a hashable, non-None id, got {seq_id!r}")

    @staticmethod
    def _check_namespace(namespace: str) -> str:
        if not isinstance(namespace, str):
            raise TypeError(f"namespace must be a str, got {type(namespace).__name__}")
        return namespace

    def _check_block(self, block: int) -> int:
        block = _as_int(block, "block", 0)
        if block >= self._num_blocks:
            raise ValueError(f"block must be in [0, {self._num_blocks - 1}], got {block}")
        return block

    def _seq(self, seq_id: Hashable) -> _Sequence:
        self._check_seq_id(seq_id)
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise ValueError(f"seq_id {seq_id!r} has no block table") from None

    # ------------------------------------------------------------------ internals: planning

    def _match(self, tokens: tuple[int, ...], namespace: str) -> list[int]:
        """Physical blocks of the longest run of leading full blocks found in the prefix cache."""
        if not self._caching:
            return []
        matched: list[int] = []
        parent: bytes | None = None
        for start in range(0, len(tokens) - self._block_size + 1, self._block_size):
            parent = prefix_block_key(parent, tokens[start : start + self._block_size], namespace)
            block = self._cache.get(parent)
            if block is None:
                break
            matched.append(block)
        return matched

    def _plan_prompt(self, tokens: tuple[int, ...], namespace: str) -> _PromptPlan:
        matched = self._match(tokens, namespace)
        cached_tokens = min(len(matched) * self._block_size, len(tokens) - 1)
        cow_src = None
        if matched and cached_tokens < len(matched) * self._block_size:
            cow_src = matched.pop()  # the cap falls inside the last matched block
        revived = {b for b in matched if self._refcount[b] == 0}
        fresh = _blocks_for(len(tokens), self._block_size) - len(matched)
        return _PromptPlan(matched, revived, fresh, cow_src, cached_tokens)

    def _append_need(self, seq: _Sequence, num_tokens: int) -> int:
        """Blocks an append of ``num_tokens`` takes off the free list (new blocks + a copy-on-write)."""
        new_blocks = _blocks_for(seq.num_tokens + num_tokens, self._block_size) - len(seq.table)
        return new_blocks + (1 if self._tail_needs_cow(seq) else 0)

    def _tail_needs_cow(self, seq: _Sequence) -> bool:
        """The tail block is shared and has free slots, so writing into it must copy it first."""
        return (
            bool(seq.table)
            and seq.num_tokens % self._block_size != 0
            and self._refcount[seq.table[-1]] > 1
        )

    def _shortfall(self, seq_id: Hashable, taken: int, exclude: int | None = None) -> int:
        """How many blocks short the pool is for taking ``taken`` blocks off the free list for ``seq_id``.

        ``exclude`` is a free block that must stay on the list (the source of a pending copy).
        """
        own = self._reserved.get(seq_id, 0)
        beyond_reservation = taken - min(taken, own)
        headroom_short = max(0, beyond_reservation - self.num_available_blocks)
        usable = len(self._free) - (1 if exclude is not None and self._refcount[exclude] == 0 else 0)
        physical_short = max(0, taken - usable)
        return max(headroom_short, physical_short)

    def _ensure_can_take(self, seq_id: Hashable, taken: int, exclude: int | None = None) -> None:
        short = self._shortfall(seq_id, taken, exclude)
        if short:
            raise OutOfBlocks(
                f"seq_id {seq_id!r} needs {taken} blocks from the pool: {len(self._free)} free, "
                f"{self.num_available_blocks} unreserved, {self._reserved.get(seq_id, 0)} reserved for "
                f"it; short by {short}"
            )

    # ------------------------------------------------------------------ internals: mutation

    def _consume_reservation(self, seq_id: Hashable, blocks: int) -> None:
        own = self._reserved.get(seq_id, 0)
        used = min(own, blocks)
        if used == 0:
            return
        if used == own:
            del self._reserved[seq_id]
        else:
            self._reserved[seq_id] = own - used
        self._total_reserved -= used

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
        self._num_filled[block] = 0
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
            self._num_filled[block] = 0
            self._free.move_to_end(block, last=False)  # holds nothing reusable: hand it out first
        return 1

    def _fill(self, seq: _Sequence, tokens: tuple[int, ...] | int) -> None:
        """Record tokens written into already-allocated slots; register blocks that became full.

        ``tokens`` is the token ids, or a bare count when the ids are unknown (restore without ids).
        """
        count = tokens if isinstance(tokens, int) else len(tokens)
        start = seq.num_tokens
        seq.num_tokens += count
        if seq.tokens is not None and not isinstance(tokens, int):
            seq.tokens.extend(tokens)
        for i in range(start // self._block_size, _blocks_for(seq.num_tokens, self._block_size)):
            block = seq.table[i]
            filled = min(self._block_size, seq.num_tokens - i * self._block_size)
            self._num_filled[block] = max(self._num_filled[block], filled)
            if filled == self._block_size:
                self._register_full(seq, i)

    def _register_full(self, seq: _Sequence, index: int) -> None:
        """Extend the sequence's key chain by its full block ``index``; publish it unless deferred."""
        if seq.tokens is None or len(seq.full_keys) != index:
            return  # ids unknown, or the chain broke earlier: this sequence no longer feeds the cache
        lo = index * self._block_size
        parent = seq.full_keys[-1] if seq.full_keys else None
        seq.full_keys.append(
            prefix_block_key(parent, seq.tokens[lo : lo + self._block_size], seq.namespace)
        )
        if not self._cache_on_compute:
            self._publish(seq, len(seq.full_keys))

    def _publish(self, seq: _Sequence, upto: int) -> int:
        """Offer full blocks ``[num_published, upto)`` to the prefix cache; returns how many were cached.

        A block is cached only if no other block already holds its key (the first copy stays).
        """
        cached = 0
        for i in range(seq.num_published, upto):
            key, block = seq.full_keys[i], seq.table[i]
            if self._caching and key not in self._cache and block not in self._key_of:
                self._cache[key] = block
                self._key_of[block] = key
                cached += 1
        seq.num_published = max(seq.num_published, upto)
        return cached
