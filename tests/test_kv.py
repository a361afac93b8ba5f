"""Tests for servelab.kv: the [D06]-[D08] numbers, the paged block allocator and its inspection view."""

import ast
import doctest
import inspect

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import servelab.kv.allocator
import servelab.kv.arithmetic
import servelab.kv.block_pool
import servelab.kv.inspection
from servelab.kv import (
    BlockAllocator,
    BlockCopy,
    BlockPoolState,
    DoubleFreeError,
    OutOfBlocks,
    block_alloc_slots,
    kv_bytes_per_token,
    kv_heads_per_tp_rank,
    physical_blocks_no_sharing,
    physical_blocks_with_sharing,
    prefix_block_key,
)

GIB = 1024**3


def test_docstring_examples_hold():
    results = [doctest.testmod(module) for module in (servelab.kv.arithmetic, servelab.kv.allocator,
                                                     servelab.kv.block_pool)]
    failed, attempted = (sum(counts) for counts in zip(*results))
    assert attempted >= 10 and failed == 0


# ---------------------------------------------------------------------------------- arithmetic


def test_d06_bytes_per_token_toy():
    assert kv_bytes_per_token(2, 2, 4, 2) == 64


def test_bytes_per_token_80_layer_gqa():
    per_token = kv_bytes_per_token(80, 8, 128, 2)
    assert per_token == 327_680
    assert per_token == 320 * 1024
    assert per_token * 8192 == 2.5 * GIB
    # counting the 64 query heads instead of the 8 KV heads overstates the cache eightfold
    assert kv_bytes_per_token(80, 64, 128, 2) == 8 * per_token


@pytest.mark.parametrize("bad", [0, -1])
def test_bytes_per_token_rejects_non_positive(bad):
    with pytest.raises(ValueError, match="n_layer"):
        kv_bytes_per_token(bad, 2, 4, 2)


def test_bytes_per_token_rejects_non_integers():
    with pytest.raises(TypeError, match="d_head"):
        kv_bytes_per_token(2, 2, 4.0, 2)
    with pytest.raises(TypeError, match="bytes_per_elem"):
        kv_bytes_per_token(2, 2, 4, True)


def test_d07_block_alloc_slots():
    logical, allocated = block_alloc_slots([1, 5], 4)
    assert (logical, allocated) == (6, 12)
    m = kv_bytes_per_token(2, 2, 4, 2)
    assert (logical * m, allocated * m) == (384, 768)


def test_block_alloc_slots_exact_multiple_has_no_fragmentation():
    assert block_alloc_slots([4, 8, 0], 4) == (12, 12)


def test_block_alloc_slots_validates():
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        block_alloc_slots([1, -2], 4)
    with pytest.raises(ValueError, match="block_size"):
        block_alloc_slots([1], 0)
    with pytest.raises(TypeError, match="lengths"):
        block_alloc_slots(5, 4)


def test_d08_sharing_drops_blocks_from_four_to_three():
    a = [10, 11, 12, 13, 20, 21]
    b = [10, 11, 12, 13, 30, 31, 32]
    assert physical_blocks_no_sharing([len(a), len(b)], 4) == 4
    assert physical_blocks_with_sharing([a, b], 4) == 3


def test_sub_block_overlap_shares_nothing():
    a = [1, 2, 3, 9, 9, 9]
    b = [1, 2, 3, 8, 8, 8, 8]
    assert physical_blocks_with_sharing([a, b], 4) == physical_blocks_no_sharing([6, 7], 4)


def test_same_tokens_after_a_different_block_do_not_share():
    # block 1 is identical but its prefix differs, so its KV differs
    a = [1, 1, 1, 1, 5, 5, 5, 5]
    b = [2, 2, 2, 2, 5, 5, 5, 5]
    assert physical_blocks_with_sharing([a, b], 4) == 4


@pytest.mark.parametrize("n", [2, 3, 5])
def test_n_way_sharing_saves_n_minus_one_times_shared_blocks(n):
    shared = list(range(8))  # 2 full blocks of 4
    seqs = [shared + [100 + i, 200 + i, 300 + i] for i in range(n)]
    saved = physical_blocks_no_sharing([len(s) for s in seqs], 4) - physical_blocks_with_sharing(seqs, 4)
    assert saved == (n - 1) * 2


def _distinct_prefix_count(seqs, block_size):
    """Independent count: distinct full-block token prefixes plus one block per partial tail."""
    prefixes = {tuple(s[: (i + 1) * block_size]) for s in seqs for i in range(len(s) // block_size)}
    return len(prefixes) + sum(1 for s in seqs if len(s) % block_size)


@settings(max_examples=100, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 2), max_size=9), min_size=1, max_size=5),
    block_size=st.integers(1, 4),
)
def test_sharing_count_matches_independent_prefix_count_and_allocator(seqs, block_size):
    expected = _distinct_prefix_count(seqs, block_size)
    assert physical_blocks_with_sharing(seqs, block_size) == expected
    # the allocator reaches the same count, plus one private copy per prompt that was a full hit
    alloc = BlockAllocator(64, block_size)
    copies = sum(len(alloc.allocate_prompt(i, s).copies) for i, s in enumerate(seqs) if s)
    assert alloc.num_used_blocks == expected + copies


def test_tp_guard():
    assert kv_heads_per_tp_rank(8, 4) == 2
    assert kv_heads_per_tp_rank(8, 8) == 1
    with pytest.raises(ValueError, match="replicat"):
        kv_heads_per_tp_rank(8, 3)
    with pytest.raises(ValueError, match="not divisible"):
        kv_heads_per_tp_rank(4, 8)
    with pytest.raises(ValueError, match="tp_degree"):
        kv_heads_per_tp_rank(8, 0)
    with pytest.raises(ValueError, match="n_kv_heads"):
        kv_heads_per_tp_rank(0, 1)


def test_prefix_key_is_salted_by_namespace_and_chained():
    k1 = prefix_block_key(None, [1, 2], "tenant-a")
    assert k1 == prefix_block_key(None, (1, 2), "tenant-a")
    assert k1 != prefix_block_key(None, [1, 2], "tenant-b")
    assert prefix_block_key(k1, [3, 4]) != prefix_block_key(None, [3, 4])
    # the separator keeps [1, 23] and [12, 3] apart
    assert prefix_block_key(None, [1, 23]) != prefix_block_key(None, [12, 3])


# ---------------------------------------------------------------------------------- allocator basics


def test_constructor_validates():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockAllocator(0, 4)
    with pytest.raises(ValueError, match="block_size"):
        BlockAllocator(4, 0)
    with pytest.raises(TypeError, match="enable_prefix_caching"):
        BlockAllocator(4, 4, enable_prefix_caching=1)


def test_prompt_allocation_and_free():
    a = BlockAllocator(8, 4)
    res = a.allocate_prompt("s", range(10))
    assert res.cached_prompt_tokens == 0 and res.copies == ()
    assert len(a.block_table("s")) == 3
    assert a.num_tokens("s") == 10
    assert a.num_used_blocks == 3 and a.num_free_blocks == 5
    a.inspect().check_invariants()
    assert a.free("s") == 3
    assert a.num_free_blocks == 8 and not a.has_sequence("s")
    a.inspect().check_invariants()


def test_allocate_prompt_rejects_bad_arguments():
    a = BlockAllocator(8, 4)
    with pytest.raises(ValueError, match="token_ids"):
        a.allocate_prompt("s", [])
    with pytest.raises(ValueError, match=r"token_ids\[1\]"):
        a.allocate_prompt("s", [1, -1])
    with pytest.raises(TypeError, match="namespace"):
        a.allocate_prompt("s", [1], namespace=3)
    a.allocate_prompt("s", [1])
    with pytest.raises(ValueError, match="already"):
        a.allocate_prompt("s", [1])
    with pytest.raises(ValueError, match="no block table"):
        a.append_tokens("ghost", [1])
    with pytest.raises(ValueError, match="block"):
        a.refcount(8)


def test_append_fills_tail_then_allocates():
    a = BlockAllocator(8, 4)
    a.allocate_prompt("s", [1, 2, 3])
    assert a.append_tokens("s", [4]) == ()
    assert len(a.block_table("s")) == 1 and a.num_tokens("s") == 4
    assert a.append_tokens("s", [5]) == ()
    assert len(a.block_table("s")) == 2 and a.num_tokens("s") == 5
    a.inspect().check_invariants()


def test_fork_then_cow_of_shared_partial_tail():
    a = BlockAllocator(8, 4)
    a.allocate_prompt("parent", [1, 2, 3, 4, 5, 6])  # one full block + a tail holding 2
    a.fork("parent", "child")
    full, tail = a.block_table("parent")
    assert a.block_table("child") == [full, tail]
    assert a.refcount(full) == 2 and a.refcount(tail) == 2
    assert a.inspect().owners()[tail] == ["parent", "child"]

    copies = a.append_tokens("child", [7])
    assert len(copies) == 1 and copies[0].src == tail
    new_tail = copies[0].dst
    assert a.block_table("child") == [full, new_tail]
    assert a.block_table("parent") == [full, tail]
    assert a.refcount(tail) == 1 and a.refcount(new_tail) == 1 and a.refcount(full) == 2
    # the parent's tail is private again: it writes in place
    assert a.append_tokens("parent", [8]) == ()
    assert a.inspect().snapshot()["blocks"][new_tail]["num_filled"] == 3
    a.inspect().check_invariants()


def test_fork_with_full_tail_needs_no_copy():
    a = BlockAllocator(8, 4)
    a.allocate_prompt("p", [1, 2, 3, 4])
    a.fork("p", "c")
    assert a.append_tokens("c", [5]) == ()
    assert a.block_table("c")[0] == a.block_table("p")[0]
    a.inspect().check_invariants()


def test_prefix_sharing_by_exact_token_match_four_to_three():
    a = BlockAllocator(16, 4)
    a.allocate_prompt("a", [10, 11, 12, 13, 20, 21])
    hit = a.allocate_prompt("b", [10, 11, 12, 13, 30, 31, 32])
    assert hit.cached_prompt_tokens == 4 and hit.copies == ()
    assert a.block_table("a")[0] == a.block_table("b")[0]
    assert a.num_used_blocks == 3
    a.inspect().check_invariants()


def test_sub_block_overlap_gets_no_hit():
    a = BlockAllocator(16, 4)
    a.allocate_prompt("a", [1, 2, 3, 9, 9])
    assert a.lookup_prefix([1, 2, 3, 8, 8]) == 0
    assert a.allocate_prompt("b", [1, 2, 3, 8, 8]).cached_prompt_tokens == 0
    assert a.num_used_blocks == 4


def test_full_hit_caps_cached_tokens_and_copies_last_block():
    a = BlockAllocator(16, 4)
    prompt = list(range(8))
    a.allocate_prompt("a", prompt)
    first, second = a.block_table("a")
    assert a.lookup_prefix(prompt) == 7
    res = a.allocate_prompt("b", prompt)
    assert res.cached_prompt_tokens == 7
    assert len(res.copies) == 1 and res.copies[0].src == second
    b_first, b_second = a.block_table("b")
    assert b_first == first and b_second == res.copies[0].dst != second
    assert a.refcount(first) == 2 and a.refcount(second) == 1 and a.refcount(b_second) == 1
    a.inspect().check_invariants()


def test_full_hit_on_freed_cached_blocks_revives_and_never_copies_into_source():
    a = BlockAllocator(2, 4)
    prompt = list(range(8))
    a.allocate_prompt("a", prompt)
    src_first, src_second = a.block_table("a")
    a.free("a")
    assert a.num_free_blocks == 2 and a.inspect().snapshot()["blocks"][src_second]["state"] == "cached"
    # pool of 2: reuse first block, copy the second into... nothing is left unless src is spared
    with pytest.raises(OutOfBlocks):
        a.allocate_prompt("b", prompt)
    a.inspect().check_invariants()
    # pool of 3: the copy source is the least recently freed block, first in line for reuse
    a3 = BlockAllocator(3, 4)
    a3.allocate_prompt("a", prompt)
    s1, s2 = a3.block_table("a")
    a3.allocate_prompt("c", [50, 51, 52, 53])
    a3.free("a")  # tail first: s2 is now at the front of the free list
    a3.free("c")
    res = a3.allocate_prompt("b", prompt)
    (copy,) = res.copies
    assert copy.src == s2 and copy.dst not in (s1, s2)
    assert a3.block_table("b") == [s1, copy.dst]
    assert a3.inspect().snapshot()["blocks"][s2]["state"] == "cached"  # still intact for the copy
    assert a3.lookup_prefix(prompt) == 7
    a3.inspect().check_invariants()


def test_namespaces_never_share():
    a = BlockAllocator(16, 4)
    prompt = list(range(9))
    a.allocate_prompt("a", prompt, namespace="tenant-a")
    assert a.lookup_prefix(prompt, namespace="tenant-b") == 0
    res = a.allocate_prompt("b", prompt, namespace="tenant-b")
    assert res.cached_prompt_tokens == 0
    assert not set(a.block_table("a")) & set(a.block_table("b"))
    assert a.lookup_prefix(prompt, namespace="tenant-a") == 8


def test_prefix_caching_disabled_never_matches():
    a = BlockAllocator(16, 4, enable_prefix_caching=False)
    a.allocate_prompt("a", list(range(8)))
    assert a.lookup_prefix(list(range(8))) == 0
    assert a.allocate_prompt("b", list(range(8))).cached_prompt_tokens == 0
    assert a.num_used_blocks == 4
    a.inspect().check_invariants()


def test_decode_filled_blocks_are_registered():
    a = BlockAllocator(16, 4)
    a.allocate_prompt("a", [1, 2])
    a.append_tokens("a", [3])
    a.append_tokens("a", [4])  # block 0 became full during decode
    a.append_tokens("a", [5])
    assert a.lookup_prefix([1, 2, 3, 4, 5]) == 4


def test_free_list_reuses_uncached_blocks_first_then_least_recently_freed():
    a = BlockAllocator(4, 2)
    a.allocate_prompt("old", [1, 1, 1])  # blocks: [full, tail]
    a.allocate_prompt("new", [2, 2, 2])
    old_full = a.block_table("old")[0]
    new_full = a.block_table("new")[0]
    a.free("old")
    a.free("new")
    assert a.num_free_blocks == 4 and a.inspect().num_cached_free_blocks == 2
    # the two uncached tails go first: both cached prefixes survive
    a.allocate_prompt("w", [7, 7, 7, 7])
    assert old_full not in a.block_table("w") and new_full not in a.block_table("w")
    assert a.lookup_prefix([1, 1, 1]) == 2 and a.lookup_prefix([2, 2, 2]) == 2
    # next comes the least recently freed cached block: "old" is evicted, "new" survives
    a.allocate_prompt("x", [8, 8])
    assert a.block_table("x") == [old_full]
    assert a.lookup_prefix([1, 1, 1]) == 0
    a.free("w")
    res = a.allocate_prompt("y", [2, 2, 9])  # revives the cached free block
    assert res.cached_prompt_tokens == 2 and a.block_table("y")[0] == new_full
    assert a.refcount(new_full) == 1
    a.inspect().check_invariants()


def test_cache_on_compute_defers_publication_until_marked():
    a = BlockAllocator(16, 4, cache_on_compute=True)
    prompt = list(range(10))
    a.allocate_prompt("a", prompt)
    # allocated but not computed: a second request must not hit unwritten blocks
    assert a.lookup_prefix(prompt) == 0
    assert a.mark_computed("a", 4) == 1
    assert a.lookup_prefix(prompt) == 4
    assert a.mark_computed("a", 3) == 0  # going backwards publishes nothing
    assert a.mark_computed("a", 10) == 1
    assert a.lookup_prefix(prompt) == 8
    with pytest.raises(ValueError, match="num_computed_tokens"):
        a.mark_computed("a", 11)
    a.inspect().check_invariants()


def test_cache_on_compute_cancelled_prefill_leaves_no_garbage_in_cache():
    a = BlockAllocator(16, 4, cache_on_compute=True)
    a.allocate_prompt("a", range(12))
    a.mark_computed("a", 4)  # one chunk done, then the request is cancelled
    a.free("a")
    assert a.lookup_prefix(range(12)) == 4
    assert a.inspect().num_cached_free_blocks == 1


def test_mark_computed_is_a_no_op_in_default_mode():
    a = BlockAllocator(16, 4)
    a.allocate_prompt("a", range(8))
    assert a.mark_computed("a", 8) == 0
    assert a.lookup_prefix(range(9)) == 8


def test_reservation_reduces_available_not_free():
    a = BlockAllocator(10, 4)
    assert a.reserve("q", 4)
    assert a.num_free_blocks == 10 and a.num_available_blocks == 6 and a.num_reserved_blocks == 4
    assert not a.reserve("r", 7)
    assert a.num_reserved_blocks == 4  # failed reservation changed nothing
    # the reserved sequence draws on its reservation first
    a.allocate_prompt("q", range(6))  # 2 blocks
    assert a.reserved_blocks("q") == 2 and a.num_available_blocks == 6
    # others may only use unreserved headroom
    with pytest.raises(OutOfBlocks):
        a.allocate_prompt("r", range(100, 125))  # 7 blocks > 6 available
    a.allocate_prompt("r", range(100, 124))
    assert a.num_available_blocks == 0
    assert a.release_reservation("q") == 2 and a.release_reservation("q") == 0
    assert a.num_available_blocks == 2
    a.inspect().check_invariants()


def test_num_blocks_to_allocate_counts_fresh_and_revived_blocks():
    a = BlockAllocator(16, 4)
    prompt = list(range(10))
    assert a.num_blocks_to_allocate(prompt) == 3
    a.allocate_prompt("a", prompt)
    assert a.num_blocks_to_allocate(prompt) == 1  # two shared live blocks, one fresh tail
    a.free("a")
    assert a.num_blocks_to_allocate(prompt) == 3  # two revived cached blocks + one fresh tail
    assert a.num_free_blocks == 16  # lookups changed nothing


def test_num_blocks_to_allocate_counts_a_free_copy_on_write_source():
    prompt = list(range(8))  # two full blocks: a full hit recomputes the last token in a copy of block 1
    for pool, fits in ((2, False), (3, True)):
        a = BlockAllocator(pool, 4)
        a.allocate_prompt("a", prompt)
        a.free("a")  # both blocks stay cached, free
        need = a.num_blocks_to_allocate(prompt)
        assert need == 3  # revive block 0, a fresh copy of block 1, and block 1 held on the free list
        assert a.reserve("b", need) is fits  # a successful reserve guarantees the allocation
        if fits:
            allocation = a.allocate_prompt("b", prompt)
            assert allocation.cached_prompt_tokens == 7 and len(allocation.copies) == 1
        else:
            with pytest.raises(OutOfBlocks):
                a.allocate_prompt("b", prompt)
        a.release_reservation("b")
        a.inspect().check_invariants()


def test_reservation_validates():
    a = BlockAllocator(4, 4)
    with pytest.raises(ValueError, match="num_blocks"):
        a.reserve("q", -1)
    with pytest.raises(TypeError, match="seq_id"):
        a.reserve(None, 1)


def test_free_is_idempotent_and_drops_reservation():
    a = BlockAllocator(8, 4)
    a.reserve("s", 3)
    a.allocate_prompt("s", range(5))
    assert a.free("s") == 2
    assert a.free("s") == 0
    assert a.free("never-seen") == 0
    assert a.num_reserved_blocks == 0 and a.num_free_blocks == 8
    a.inspect().check_invariants()


def test_shared_block_returns_only_with_last_holder():
    a = BlockAllocator(8, 4)
    a.allocate_prompt("p", range(6))
    a.fork("p", "c")
    assert a.free("p") == 0
    assert a.num_used_blocks == 2
    assert a.free("c") == 2
    a.inspect().check_invariants()


def test_internal_double_decref_raises():
    a = BlockAllocator(4, 4)
    a.allocate_prompt("s", [1, 2])
    (block,) = a.block_table("s")
    a.free("s")
    with pytest.raises(DoubleFreeError):
        a._decref(block)  # the guard that free() relies on


def test_out_of_blocks_leaves_state_unchanged():
    a = BlockAllocator(4, 4)
    a.allocate_prompt("a", range(6))
    a.fork("a", "b")
    a.reserve("z", 1)
    before = a.inspect().snapshot()
    with pytest.raises(OutOfBlocks):
        a.allocate_prompt("c", range(9))  # 3 blocks, only 1 unreserved
    with pytest.raises(OutOfBlocks):
        a.append_tokens("a", range(2, 12))  # CoW + 2 more blocks
    with pytest.raises(OutOfBlocks):
        a.restore("r", 9)
    assert not a.can_append("a", 10)
    assert a.inspect().snapshot() == before
    assert not a.has_sequence("c") and not a.has_sequence("r")
    a.inspect().check_invariants()


def test_can_append_counts_cow():
    a = BlockAllocator(3, 4)
    a.allocate_prompt("a", range(6))
    a.fork("a", "b")
    assert a.can_append("b", 2)  # CoW needs 1 block, 1 is free
    a.allocate_prompt("x", [1])
    assert not a.can_append("b", 1)  # shared partial tail, no block for the copy
    assert a.can_append("x", 3)


def test_restore_allocates_fresh_blocks():
    a = BlockAllocator(8, 4)
    table = a.restore("s", 9, token_ids=range(9))
    assert len(table) == 3 and a.num_tokens("s") == 9
    assert a.lookup_prefix(range(9)) == 8
    a.restore("t", 5)  # ids unknown: counts only, never cached
    a.append_tokens("t", [1, 2, 3])
    assert a.num_tokens("t") == 8
    with pytest.raises(ValueError, match="token_ids"):
        a.restore("u", 3, token_ids=[1])
    a.inspect().check_invariants()


def test_snapshot_is_plain_data():
    a = BlockAllocator(4, 2)
    a.allocate_prompt("s", [1, 2, 3])
    snap = a.inspect().snapshot()
    assert snap["sequences"]["s"] == {"block_table": a.block_table("s"), "num_tokens": 3, "reserved": 0}
    states = [b["state"] for b in snap["blocks"]]
    assert states.count("used") == 2 and states.count("free") == 2
    filled = {b["block"]: b["num_filled"] for b in snap["blocks"]}
    assert [filled[b] for b in a.block_table("s")] == [2, 1]


def test_check_invariants_detects_corruption():
    a = BlockAllocator(4, 4)
    a.allocate_prompt("s", [1])
    a._refcount[a.block_table("s")[0]] += 1
    with pytest.raises(AssertionError):
        a.inspect().check_invariants()


def test_the_view_reads_only_the_pools_public_interface():
    # no attribute of the pool starting with "_" is touched, and only names BlockPoolState declares
    declared = {name for name in vars(BlockPoolState) if not name.startswith("_")}
    tree = ast.parse(inspect.getsource(servelab.kv.inspection))
    read = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and ast.unparse(node.value) in ("self._pool", "pool")}
    assert read and read <= declared, read - declared
    assert declared <= set(dir(BlockAllocator))


def test_the_view_follows_the_pool_it_was_taken_from():
    a = BlockAllocator(8, 4)
    view = a.inspect()
    a.allocate_prompt("p", [1, 2, 3, 4, 5])
    a.fork("p", "c")
    assert view.num_shared_blocks == 2 and view.owners()[a.block_table("c")[1]] == ["p", "c"]
    a.free("p")
    a.free("c")
    assert view.num_shared_blocks == 0 and view.num_cached_free_blocks == 1
    view.check_invariants()


# ---------------------------------------------------------------------------------- random operations


class AllocatorMachine(RuleBasedStateMachine):
    """Random reserve / allocate / append / fork / free sequences keep every invariant.

    A simulated engine writes each slot's "KV" as (namespace, token prefix up to that slot) and
    applies every BlockCopy, so any wrong prefix hit, missed copy-on-write or reuse of a live block
    shows up as a slot whose content disagrees with its sequence.
    """

    @initialize(num_blocks=st.integers(1, 12), block_size=st.integers(1, 4), caching=st.booleans(),
                deferred=st.booleans())
    def setup(self, num_blocks, block_size, caching, deferred):
        self.alloc = BlockAllocator(num_blocks, block_size, enable_prefix_caching=caching,
                                    cache_on_compute=deferred)
        self.next_id = 0
        self.live = []
        self.kv = {}  # simulated device memory: block -> {slot: content}
        self.tokens = {}  # seq id -> (namespace, token ids)

    def _apply(self, copies):
        for copy in copies:
            self.kv[copy.dst] = dict(self.kv.get(copy.src, {}))

    def _write(self, seq_id, start):
        ns, tokens = self.tokens[seq_id]
        table, bs = self.alloc.block_table(seq_id), self.alloc.block_size
        for pos in range(start, len(tokens)):
            self.kv.setdefault(table[pos // bs], {})[pos % bs] = (ns, tuple(tokens[: pos + 1]))

    def _new_id(self):
        self.next_id += 1
        return f"s{self.next_id}"

    @rule(n=st.integers(0, 4))
    def reserve(self, n):
        seq_id = self._new_id()
        before = self.alloc.num_available_blocks
        ok = self.alloc.reserve(seq_id, n)
        assert ok == (n <= before)
        if ok and n:
            self.live.append(seq_id)

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=10), reuse=st.booleans(),
          ns=st.sampled_from(["", "t"]))
    def allocate(self, tokens, reuse, ns):
        candidates = [s for s in self.live if not self.alloc.has_sequence(s)]
        seq_id = candidates[0] if reuse and candidates else self._new_id()
        expected_hit = self.alloc.lookup_prefix(tokens, ns)
        before = self.alloc.inspect().snapshot()
        try:
            res = self.alloc.allocate_prompt(seq_id, tokens, ns)
        except OutOfBlocks:
            assert self.alloc.inspect().snapshot() == before
            return
        assert res.cached_prompt_tokens == expected_hit <= len(tokens) - 1
        assert self.alloc.num_tokens(seq_id) == len(tokens)
        self.tokens[seq_id] = (ns, list(tokens))
        self._apply(res.copies)
        self._write(seq_id, res.cached_prompt_tokens)
        if seq_id not in self.live:
            self.live.append(seq_id)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 2), min_size=1, max_size=5))
    def append(self, data, tokens):
        seq_id = data.draw(st.sampled_from(self.live))
        if not self.alloc.has_sequence(seq_id):
            return
        can = self.alloc.can_append(seq_id, len(tokens))
        before = self.alloc.inspect().snapshot()
        n = self.alloc.num_tokens(seq_id)
        try:
            copies = self.alloc.append_tokens(seq_id, tokens)
        except OutOfBlocks:
            assert not can and self.alloc.inspect().snapshot() == before
            return
        assert can
        assert self.alloc.num_tokens(seq_id) == n + len(tokens)
        for copy in copies:
            assert isinstance(copy, BlockCopy) and self.alloc.refcount(copy.dst) == 1
        self.tokens[seq_id][1].extend(tokens)
        self._apply(copies)
        self._write(seq_id, n)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def mark_computed(self, data):
        seq_id = data.draw(st.sampled_from(self.live))
        if self.alloc.has_sequence(seq_id):
            n = data.draw(st.integers(0, self.alloc.num_tokens(seq_id)))
            assert self.alloc.mark_computed(seq_id, n) >= 0

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.live))
        if not self.alloc.has_sequence(parent):
            return
        child = self._new_id()
        self.alloc.fork(parent, child)
        assert self.alloc.block_table(child) == self.alloc.block_table(parent)
        ns, tokens = self.tokens[parent]
        self.tokens[child] = (ns, list(tokens))
        self.live.append(child)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        seq_id = data.draw(st.sampled_from(self.live))
        self.alloc.free(seq_id)
        assert self.alloc.free(seq_id) == 0
        self.live.remove(seq_id)
        self.tokens.pop(seq_id, None)

    @invariant()
    def consistent(self):
        if hasattr(self, "alloc"):
            self.alloc.inspect().check_invariants()

    @invariant()
    def every_slot_holds_its_own_prefix(self):
        if not hasattr(self, "alloc"):
            return
        bs = self.alloc.block_size
        for seq_id, (ns, tokens) in self.tokens.items():
            table = self.alloc.block_table(seq_id)
            for pos in range(len(tokens)):
                assert self.kv[table[pos // bs]][pos % bs] == (ns, tuple(tokens[: pos + 1])), (seq_id, pos)

    def teardown(self):
        if not hasattr(self, "alloc"):
            return
        for seq_id in list(self.live):
            self.alloc.free(seq_id)
        a = self.alloc
        a.inspect().check_invariants()
        assert a.num_free_blocks == a.num_blocks and a.num_used_blocks == 0
        assert a.num_reserved_blocks == 0 and a.num_available_blocks == a.num_blocks
        assert all(a.refcount(b) == 0 for b in range(a.num_blocks))


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
