"""Tests for servelab.lifecycle.state_machine: the §0.2 state table, guarded transitions and the shared reclaim."""

import threading
from collections import deque

import pytest

from servelab.kv import BlockAllocator
from servelab.lifecycle.state_machine import (
    STATE_TABLE,
    TERMINAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    Ledger,
    RequestLifecycle,
    RequestState,
    Resource,
    SlotPool,
    TerminalRecord,
    Usage,
    reclaim,
)

S = RequestState
RUNNING = {S.PREFILL, S.DECODE, S.BACKPRESSURED}


def _walk(lc, *states, start=1.0):
    for i, state in enumerate(states):
        lc.transition(state, at=start + i)


# ---------------------------------------------------------------------------------- the table


def test_every_state_has_a_row_and_a_transition_set():
    assert set(STATE_TABLE) == set(RequestState) == set(TRANSITIONS)
    assert len(RequestState) == 14
    for targets in TRANSITIONS.values():
        assert targets <= set(RequestState)


def test_runnable_is_the_prefill_state():
    assert S.RUNNABLE is S.PREFILL


def test_terminal_states_have_no_way_out_and_non_terminal_ones_can_end():
    assert TERMINAL_STATES == {S.FINISHED, S.REJECTED, S.CANCELLED, S.TIMED_OUT, S.FAILED}
    for state, info in STATE_TABLE.items():
        if info.terminal:
            assert TRANSITIONS[state] == frozenset()
            assert info.holds == ()
        else:
            assert TRANSITIONS[state], state
            # every live state can be cancelled and can fail
            assert {S.CANCELLED, S.FAILED} <= TRANSITIONS[state], state


def test_every_state_is_reachable_from_arrival():
    seen, todo = {S.ARRIVED}, deque([S.ARRIVED])
    while todo:
        for nxt in TRANSITIONS[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(RequestState)


def test_rejected_from_both_admission_checks_only():
    sources = {s for s, targets in TRANSITIONS.items() if S.REJECTED in targets}
    assert sources == {S.ARRIVED, S.VALIDATED}


@pytest.mark.parametrize(
    "side", [S.PREEMPTED, S.SWAPPED, S.BACKPRESSURED, S.TIMED_OUT, S.CANCELLED, S.FAILED]
)
def test_side_branches_reachable_from_running_stages(side):
    sources = {s for s, targets in TRANSITIONS.items() if side in targets}
    expected = RUNNING if side is not S.BACKPRESSURED else {S.DECODE}
    assert expected <= sources


def test_happy_path_is_allowed():
    path = [S.ARRIVED, S.VALIDATED, S.QUEUED, S.PREFILL, S.DECODE, S.FINISHED]
    for a, b in zip(path, path[1:]):
        assert b in TRANSITIONS[a]


def test_holds_match_the_cleanup_protocol():
    queued = STATE_TABLE[S.QUEUED].holds
    assert Resource.KV_RESERVATION in queued and Resource.KV_BLOCKS not in queued
    assert Resource.KV_BLOCKS not in STATE_TABLE[S.DEGRADED].holds
    for state in RUNNING:
        assert {Resource.KV_BLOCKS, Resource.BATCH_SLOT} <= set(STATE_TABLE[state].holds)
    assert Resource.HOST_SWAP in STATE_TABLE[S.SWAPPED].holds
    for state in (S.PREEMPTED, S.SWAPPED):
        assert Resource.KV_BLOCKS not in STATE_TABLE[state].holds
    for info in STATE_TABLE.values():
        assert info.summary and info.guard and info.cleanup


# ---------------------------------------------------------------------------------- transitions


def test_transition_records_history():
    lc = RequestLifecycle("r1", at=0.5)
    _walk(lc, S.VALIDATED, S.QUEUED, S.PREFILL)
    assert lc.state is S.PREFILL
    assert lc.history == ((S.ARRIVED, 0.5), (S.VALIDATED, 1.0), (S.QUEUED, 2.0), (S.PREFILL, 3.0))


def test_illegal_transition_names_both_states():
    lc = RequestLifecycle("r1")
    with pytest.raises(IllegalTransition, match="ARRIVED -> DECODE"):
        lc.transition(S.DECODE, at=1.0)
    assert isinstance(IllegalTransition("x"), ValueError)
    assert lc.state is S.ARRIVED and len(lc.history) == 1


def test_terminal_states_are_entered_only_through_reclaim():
    lc = RequestLifecycle("r1")
    with pytest.raises(IllegalTransition, match="reclaim"):
        lc.transition(S.REJECTED, at=1.0)
    assert lc.state is S.ARRIVED


def test_time_must_not_go_backwards_and_arguments_are_checked():
    lc = RequestLifecycle("r1", at=5.0)
    with pytest.raises(ValueError, match="at must be >= 5.0"):
        lc.transition(S.VALIDATED, at=4.0)
    with pytest.raises(TypeError, match="to"):
        lc.transition("validated", at=6.0)
    with pytest.raises(ValueError, match="finite"):
        lc.transition(S.VALIDATED, at=float("nan"))
    with pytest.raises(TypeError, match="request_id"):
        RequestLifecycle(None)


# ---------------------------------------------------------------------------------- support types


def test_slot_pool():
    pool = SlotPool(2)
    assert pool.acquire("a") and pool.acquire("b")
    assert not pool.acquire("c")
    assert pool.in_use == 2 and pool.available == 0
    assert pool.release("a") == 1 and pool.release("a") == 0
    assert pool.acquire("c") and pool.held_by("c") == 1
    with pytest.raises(ValueError, match="capacity"):
        SlotPool(0)
    with pytest.raises(ValueError, match="n must be"):
        pool.acquire("d", 0)


def test_usage_validates():
    with pytest.raises(ValueError, match="emitted_tokens"):
        Usage(prompt_tokens=3, generated_tokens=2, emitted_tokens=3)
    with pytest.raises(ValueError, match="prompt_tokens"):
        Usage(prompt_tokens=-1)


def test_ledger_keeps_one_record_per_request():
    ledger = Ledger()
    rec = TerminalRecord("r", S.FINISHED, "", 1.0, Usage(), S.DECODE, 0, 0, 0, 0)
    ledger.append(rec)
    with pytest.raises(ValueError, match="already"):
        ledger.append(rec)
    assert list(ledger) == [rec] and len(ledger) == 1


# ---------------------------------------------------------------------------------- reclaim


def _running_request(alloc, slots, request_id="r", prompt=range(10), n=1):
    """A request in DECODE holding a slot, blocks for its prompt, and n-1 forked samples."""
    lc = RequestLifecycle(request_id)
    _walk(lc, S.VALIDATED, S.QUEUED)
    assert alloc.reserve(f"{request_id}/0", 4)
    assert slots.acquire(request_id)
    lc.transition(S.PREFILL, at=3.0)
    alloc.allocate_prompt(f"{request_id}/0", prompt)
    for i in range(1, n):
        alloc.fork(f"{request_id}/0", f"{request_id}/{i}")
    lc.transition(S.DECODE, at=4.0)
    return lc, tuple(f"{request_id}/{i}" for i in range(n))


def test_finished_reclaim_frees_blocks_slot_and_writes_one_record():
    alloc, slots, ledger = BlockAllocator(16, 4), SlotPool(4), Ledger()
    lc, seqs = _running_request(alloc, slots, n=3)  # best-of-3: 3 blocks shared 3 ways
    assert alloc.num_used_blocks == 3 and alloc.num_reserved_blocks == 1
    usage = Usage(prompt_tokens=10, generated_tokens=5, emitted_tokens=4)
    assert reclaim(lc, S.FINISHED, ledger=ledger, at=9.0, reason="eos",
                   allocator=alloc, seq_ids=seqs, slots=slots, usage=usage)
    assert lc.state is S.FINISHED and lc.history[-1] == (S.FINISHED, 9.0)
    (rec,) = ledger.records
    assert (rec.request_id, rec.state, rec.reason, rec.from_state) == ("r", S.FINISHED, "eos", S.DECODE)
    assert (rec.blocks_freed, rec.reservation_released, rec.slots_released) == (3, 1, 1)
    assert rec.usage == usage
    assert alloc.num_free_blocks == 16 and alloc.num_reserved_blocks == 0 and slots.in_use == 0
    alloc.inspect().check_invariants()


def test_shared_prefix_block_survives_one_holder_reclaim():
    alloc, slots, ledger = BlockAllocator(16, 4), SlotPool(4), Ledger()
    lc_a, seqs_a = _running_request(alloc, slots, "a", prompt=range(6))
    lc_b, seqs_b = _running_request(alloc, slots, "b", prompt=[0, 1, 2, 3, 9])
    shared = alloc.block_table(seqs_a[0])[0]
    assert alloc.refcount(shared) == 2
    reclaim(lc_a, S.CANCELLED, ledger=ledger, at=5.0, allocator=alloc, seq_ids=seqs_a, slots=slots)
    assert alloc.refcount(shared) == 1 and ledger.records[0].blocks_freed == 1
    reclaim(lc_b, S.FINISHED, ledger=ledger, at=6.0, allocator=alloc, seq_ids=seqs_b, slots=slots)
    assert alloc.num_used_blocks == 0 and len(ledger) == 2
    alloc.inspect().check_invariants()


def test_queued_reclaim_rolls_back_only_its_reservation():
    alloc, slots, ledger = BlockAllocator(16, 4), SlotPool(4), Ledger()
    other, other_seqs = _running_request(alloc, slots, "other")
    before_table = alloc.block_table(other_seqs[0])
    lc = RequestLifecycle("q")
    _walk(lc, S.VALIDATED, S.QUEUED)
    assert alloc.reserve("q/0", 5)
    free_before, reserved_before = alloc.num_free_blocks, alloc.num_reserved_blocks
    assert reclaim(lc, S.TIMED_OUT, ledger=ledger, at=7.0, allocator=alloc, seq_ids=["q/0"], slots=slots)
    assert alloc.num_free_blocks == free_before
    assert alloc.num_reserved_blocks == reserved_before - 5
    assert alloc.block_table(other_seqs[0]) == before_table and slots.held_by("other") == 1
    rec = ledger.records[0]
    assert (rec.blocks_freed, rec.reservation_released, rec.slots_released) == (0, 5, 0)
    alloc.inspect().check_invariants()


def test_swapped_reclaim_releases_host_swap_space():
    alloc, slots, host, ledger = BlockAllocator(8, 4), SlotPool(2), SlotPool(8), Ledger()
    lc, seqs = _running_request(alloc, slots)
    assert host.acquire("r", len(alloc.block_table(seqs[0])))
    alloc.free(seqs[0])
    slots.release("r")
    lc.transition(S.SWAPPED, at=5.0)
    assert reclaim(lc, S.CANCELLED, ledger=ledger, at=6.0, allocator=alloc, seq_ids=seqs,
                   slots=slots, host_swap=host)
    assert host.in_use == 0 and ledger.records[0].swap_released == 3
    assert ledger.records[0].blocks_freed == 0


def test_rejected_goes_through_reclaim_with_nothing_to_release():
    ledger = Ledger()
    lc = RequestLifecycle("r")
    assert reclaim(lc, S.REJECTED, ledger=ledger, at=0.1, reason="rate limit")
    assert ledger.records[0].state is S.REJECTED and lc.is_terminal


def test_cancel_timeout_race_first_wins_and_nothing_is_freed_twice():
    alloc, slots, ledger = BlockAllocator(16, 4), SlotPool(4), Ledger()
    lc, seqs = _running_request(alloc, slots)
    kwargs = dict(ledger=ledger, allocator=alloc, seq_ids=seqs, slots=slots)
    assert reclaim(lc, S.CANCELLED, at=5.0, reason="disconnect", **kwargs)
    # the block is re-used by someone else before the late timeout fires
    alloc.allocate_prompt("newcomer", range(100, 112))
    used = alloc.num_used_blocks
    assert reclaim(lc, S.TIMED_OUT, at=5.0, reason="deadline", **kwargs) is False
    assert lc.state is S.CANCELLED and len(ledger) == 1
    assert alloc.num_used_blocks == used and alloc.has_sequence("newcomer")
    alloc.inspect().check_invariants()


def test_threaded_race_writes_exactly_one_record():
    for trial in range(20):
        alloc, slots, ledger = BlockAllocator(16, 4), SlotPool(4), Ledger()
        lc, seqs = _running_request(alloc, slots, n=2)
        barrier = threading.Barrier(4)
        results = []

        def end(state):
            barrier.wait()
            results.append(reclaim(lc, state, ledger=ledger, at=6.0, allocator=alloc,
                                   seq_ids=seqs, slots=slots))

        threads = [threading.Thread(target=end, args=(s,))
                   for s in (S.CANCELLED, S.TIMED_OUT, S.FAILED, S.CANCELLED)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [False, False, False, True], trial
        assert len(ledger) == 1 and ledger.records[0].state is lc.state
        assert ledger.records[0].blocks_freed == 3
        assert alloc.num_free_blocks == 16 and alloc.num_reserved_blocks == 0 and slots.in_use == 0
        alloc.inspect().check_invariants()


def test_illegal_reclaim_changes_nothing():
    alloc, slots, ledger = BlockAllocator(16, 4), SlotPool(4), Ledger()
    lc = RequestLifecycle("q")
    _walk(lc, S.VALIDATED, S.QUEUED)
    alloc.reserve("q/0", 2)
    with pytest.raises(IllegalTransition, match="QUEUED -> FINISHED"):
        reclaim(lc, S.FINISHED, ledger=ledger, at=5.0, allocator=alloc, seq_ids=["q/0"])
    with pytest.raises(ValueError, match="terminal_state"):
        reclaim(lc, S.DECODE, ledger=ledger, at=5.0)
    with pytest.raises(ValueError, match="allocator"):
        reclaim(lc, S.CANCELLED, ledger=ledger, at=5.0, seq_ids=["q/0"])
    with pytest.raises(ValueError, match="at must be"):
        reclaim(lc, S.CANCELLED, ledger=ledger, at=1.0, allocator=alloc, seq_ids=["q/0"])
    assert lc.state is S.QUEUED and len(ledger) == 0 and alloc.num_reserved_blocks == 2


def test_a_lifecycle_first_seen_in_a_later_state_still_ends_only_through_reclaim():
    """The engine reads a request's state off its scheduler and builds the lifecycle then."""
    lc = RequestLifecycle("e", at=3.0, state=S.DECODE)
    assert lc.history == ((S.DECODE, 3.0),)
    with pytest.raises(IllegalTransition, match="DECODE -> QUEUED"):
        lc.transition(S.QUEUED, 3.0)
    ledger = Ledger()
    assert reclaim(lc, S.FINISHED, ledger=ledger, at=3.0) and ledger.get("e").from_state is S.DECODE
    with pytest.raises(ValueError, match="non-terminal"):
        RequestLifecycle("f", state=S.FINISHED)
    with pytest.raises(TypeError, match="state must be a RequestState"):
        RequestLifecycle("f", state="DECODE")
