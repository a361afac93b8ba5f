from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.scheduling.batching import (
    QUEUE_POLICIES,
    PrefillRequest,
    Request,
    TickRecord,
    chunked_prefill_scenario,
    simulate_batching,
    simulate_iterations,
    simulate_queue_policies,
    utilization,
    verify_schedule,
)

SEED_REQS = [Request("A", 0, 1), Request("B", 0, 4), Request("C", 0, 1)]


def test_seed_static_and_continuous_completion_and_utilization():
    static, _ = simulate_batching(SEED_REQS, 2, "static")
    cont, _ = simulate_batching(SEED_REQS, 2, "continuous")
    assert static == {"A": 1, "B": 4, "C": 5}
    assert cont == {"A": 1, "C": 2, "B": 4}
    u_s, detail_s = utilization(static, SEED_REQS, 2)
    u_c, detail_c = utilization(cont, SEED_REQS, 2)
    assert u_s == pytest.approx(0.60) and detail_s["slot_ticks"] == 10
    assert u_c == pytest.approx(0.75) and detail_c["slot_ticks"] == 8


def test_static_trace_keeps_finished_slot_empty():
    _, trace = simulate_batching(SEED_REQS, 2, "static")
    assert [rec.active for rec in trace] == [("A", "B"), ("B",), ("B",), ("B",), ("C",)]
    assert trace[1].queued == ("C",)


def test_equal_length_counterexample_same_makespan():
    reqs = [Request("X", 0, 3), Request("Y", 0, 3)]
    static, _ = simulate_batching(reqs, 2, "static")
    cont, _ = simulate_batching(reqs, 2, "continuous")
    assert static == cont
    assert max(static.values()) == max(cont.values()) == 3


def test_delayed_arrivals_never_run_early():
    reqs = [Request("A", 0, 2), Request("B", 3, 2), Request("C", 4, 1)]
    for policy in ("static", "continuous"):
        completion, trace = simulate_batching(reqs, 2, policy)
        for rec in trace:
            for name in rec.active:
                r = next(r for r in reqs if r.name == name)
                assert r.arrival <= rec.tick < completion[name]
    assert simulate_batching(reqs, 2, "continuous")[0] == {"A": 2, "B": 5, "C": 5}
    assert trace[2].active == ()  # idle tick while nothing has arrived


@pytest.mark.parametrize(
    "make, exc, word",
    [
        (lambda: simulate_batching([], 2, "static"), ValueError, "reqs"),
        (lambda: simulate_batching(["A"], 2, "static"), TypeError, "reqs"),
        (lambda: simulate_batching([Request("A", 0, 1), Request("A", 1, 1)], 2, "static"), ValueError,
         "unique"),
        (lambda: simulate_batching(SEED_REQS, 0, "static"), ValueError, "capacity"),
        (lambda: simulate_batching(SEED_REQS, 2, "greedy"), ValueError, "policy"),
        (lambda: Request("A", -1, 1), ValueError, "arrival"),
        (lambda: Request("A", 0, 0), ValueError, "ticks_needed"),
        (lambda: simulate_batching(SEED_REQS, 2.0, "static"), TypeError, "capacity"),
        (lambda: Request("A", 0.5, 1), TypeError, "arrival"),
    ],
)
def test_illegal_inputs_rejected(make, exc, word):
    with pytest.raises(exc, match=word):
        make()


def test_verify_schedule_catches_broken_invariants():
    completion, trace = simulate_batching(SEED_REQS, 2, "continuous")
    verify_schedule(SEED_REQS, 2, completion, trace)
    overfull = [TickRecord(0, ("A", "B", "C"), ("A", "B", "C"), ())] + trace[1:]
    with pytest.raises(RuntimeError, match="capacity"):
        verify_schedule(SEED_REQS, 2, completion, overfull)
    lost_token = trace[:-1]
    with pytest.raises(RuntimeError, match="emitted"):
        verify_schedule(SEED_REQS, 2, completion, lost_token)
    late = dict(completion, A=3)
    with pytest.raises(RuntimeError, match="last emit"):
        verify_schedule(SEED_REQS, 2, late, trace)


requests_strategy = st.lists(
    st.tuples(st.integers(0, 6), st.integers(1, 5)), min_size=1, max_size=6
).map(lambda rows: [Request(f"r{i}", a, n) for i, (a, n) in enumerate(rows)])


@settings(max_examples=40, deadline=None)
@given(requests_strategy, st.integers(1, 3))
def test_continuous_is_work_conserving(reqs, capacity):
    simulate_batching(reqs, capacity, "static")  # runs its own invariant checks
    cont, trace = simulate_batching(reqs, capacity, "continuous")
    # continuous batching is work-conserving: a slot is never idle while someone waits
    for rec in trace:
        assert not rec.queued or len(rec.active) == capacity
    assert sum(r.ticks_needed for r in reqs) == sum(len(rec.active) for rec in trace)
    assert utilization(cont, reqs, capacity)[0] <= 1.0


def test_chunked_prefill_scenario_tradeoff():
    s = chunked_prefill_scenario()
    unchunked = simulate_iterations(s.requests, s.tokens_per_tick, None)
    chunked = simulate_iterations(s.requests, s.tokens_per_tick, s.chunked_budget)
    assert unchunked.max_decode_gap() == 3 and chunked.max_decode_gap() == 1
    assert unchunked.ttft(s.long_prompt) == 3 and chunked.ttft(s.long_prompt) == 4
    # every token is emitted exactly once
    for trace in (unchunked, chunked):
        assert {k: len(v) for k, v in trace.emit_times.items()} == {"S": 6, "L": 2}


def test_iteration_duration_follows_token_count():
    trace = simulate_iterations([PrefillRequest("P", 0, 10, 1)], tokens_per_tick=4)
    assert trace.iterations[0].end == Fraction(10, 4)
    assert trace.ttft("P") == Fraction(5, 2)
    late = simulate_iterations([PrefillRequest("Q", 5, 3, 1)], tokens_per_tick=3)
    assert late.iterations[0].start == 5 and late.ttft("Q") == 1


def test_iteration_inputs_rejected():
    with pytest.raises(ValueError, match="requests"):
        simulate_iterations([], 3)
    with pytest.raises(ValueError, match="token_budget"):
        simulate_iterations([PrefillRequest("P", 0, 1, 1)], 3, 0)
    with pytest.raises(ValueError, match="output_tokens"):
        PrefillRequest("P", 0, 1, 0)
    with pytest.raises(ValueError, match="name"):
        simulate_iterations([PrefillRequest("S", 0, 0, 2)], 3).ttft("S")


@settings(max_examples=40, deadline=None)
@given(
    streams=st.lists(st.integers(1, 8), min_size=0, max_size=3),
    prompt=st.integers(1, 30),
    rate=st.integers(1, 6),
    budgets=st.tuples(st.integers(1, 20), st.integers(1, 20)),
)
def test_smaller_chunks_never_raise_gap_nor_lower_ttft(streams, prompt, rate, budgets):
    reqs = [PrefillRequest(f"s{i}", 0, 0, n) for i, n in enumerate(streams)]
    reqs.append(PrefillRequest("L", 0, prompt, 3))
    small, large = sorted(budgets)
    runs = [simulate_iterations(reqs, rate, b) for b in (small, large, None)]
    gaps = [r.max_decode_gap() for r in runs]
    ttfts = [r.ttft("L") for r in runs]
    assert gaps == sorted(gaps)
    assert ttfts == sorted(ttfts, reverse=True)


SHORT_STREAM = [Request("long", 0, 5)] + [Request(f"s{i}", i, 1) for i in range(6)]


def test_sjf_starves_long_fcfs_blocks_head_of_line():
    fcfs, _ = simulate_queue_policies(SHORT_STREAM, "fcfs", capacity=1)
    sjf, _ = simulate_queue_policies(SHORT_STREAM, "sjf", capacity=1)
    assert fcfs["long"].wait == 0 and sjf["long"].wait == 6
    short_wait = lambda out: sum(o.wait for n, o in out.items() if n != "long")  # noqa: E731
    assert short_wait(fcfs) == 30 and short_wait(sjf) == 0


def test_prefill_priority_stalls_decode_and_decode_priority_delays_ttft():
    work = [Request("A", 0, 5), Request("B", 1, 2), Request("C", 2, 2)]
    out = {p: simulate_queue_policies(work, p, capacity=2)[0] for p in
           ("fcfs", "prefill-priority", "decode-priority")}
    assert out["fcfs"]["A"].max_gap == 1
    assert out["prefill-priority"]["A"].max_gap == 2  # B's prefill tick stalls A
    assert out["prefill-priority"]["A"].completion > out["fcfs"]["A"].completion
    assert out["decode-priority"]["B"].ttft == 5 > out["fcfs"]["B"].ttft == 1


def test_queue_policy_rejects_unknown_policy():
    with pytest.raises(ValueError, match="policy"):
        simulate_queue_policies(SEED_REQS, "lifo")


@settings(max_examples=30, deadline=None)
@given(requests_strategy, st.integers(1, 3), st.sampled_from(QUEUE_POLICIES))
def test_queue_policies_keep_invariants(reqs, capacity, policy):
    outcomes, trace = simulate_queue_policies(reqs, policy, capacity)  # verify_schedule runs inside
    for r in reqs:
        o = outcomes[r.name]
        assert o.admitted >= r.arrival and o.ttft == o.wait + 1
        assert o.completion - o.admitted >= r.ticks_needed
    if policy in ("fcfs", "sjf"):  # mixed iterations: nobody is ever stalled once running
        assert all(o.max_gap in (None, 1) for o in outcomes.values())
