"""The admission rule (servelab.engine.admission.ReservationPolicy): on-demand vs up-front KV reservation.

Two-phase admission holds a reservation from admission until the blocks it promised are allocated or
the request ends; every exit path (finish, cancel, deadline, failure, preemption, a sample ending early)
releases it. Small random-weight models (the fixtures of test_engine) keep it fast on CPU."""

import pytest

from servelab.engine import EngineConfig, LLMEngine
from servelab.bench.admission_study import compare_reservation_policies
from servelab.engine.config import RESERVATION_POLICIES
from servelab.engine.admission import reservation_policy
from servelab.lifecycle.state_machine import RequestState
from servelab.sampling import SamplingParams

from test_engine import assert_clean, config, expected_ids, make_prompts, model, tokenizer  # noqa: F401 (fixtures)

LONG = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def test_policy_arithmetic():
    on_demand, up_front = reservation_policy("on-demand", 4, 64), reservation_policy("up-front", 4, 64)
    assert on_demand.preempts and not up_front.preempts
    assert on_demand.output_blocks(6, 20, 1) == 0
    assert up_front.output_blocks(6, 20, 1) == 7 - 2  # 26 tokens need 7 blocks, the prompt's 6 need 2
    assert up_front.output_blocks(6, 100, 1) == 16 - 2  # capped at max_model_len = 64 tokens
    assert up_front.output_blocks(8, 4, 3) == 3 * 1  # full tail: no copy-on-write block
    assert up_front.output_blocks(6, 4, 3) == 3 * (3 - 2 + 1)  # shared partial tail: one CoW block each
    assert on_demand.worst_case_blocks(6, 20, 3) == 7
    assert up_front.worst_case_blocks(6, 20, 3) == 2 + 3 * (7 - 2 + 1)
    with pytest.raises(ValueError, match="reservation_policy"):
        EngineConfig(reservation_policy="lazy")
    assert EngineConfig().reservation_policy == "on-demand" == RESERVATION_POLICIES[0]


def test_up_front_holds_the_output_promise_until_the_end(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, num_blocks=40, max_model_len=64,
                                                reservation_policy="up-front"))
    request = engine.add_request(list(range(1, 7)), LONG)  # 6 prompt tokens + 20: 7 blocks, 2 for the prompt
    engine.step()
    alloc = engine.allocator
    assert len(alloc.block_table(request)) == 2 and alloc.reserved_blocks(request) == 5
    for _ in range(6):
        engine.step()
        held = len(alloc.block_table(request)) + alloc.reserved_blocks(request)
        assert held == 7  # every block it can need: allocated ones plus the rest of the promise
    while engine.has_unfinished():
        engine.step()
    assert_clean(engine, 1)
    assert engine.ledger.records[0].state is RequestState.FINISHED


def test_on_demand_keeps_no_reservation_after_admission(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, num_blocks=40, max_model_len=64))
    engine.add_request(list(range(1, 7)), LONG)
    engine.step()
    assert engine.allocator.num_reserved_blocks == 0 and engine.allocator.num_used_blocks == 2


def run_to_end(engine, prompts, params):
    ids = [engine.add_request(p, params) for p in prompts]
    finals = {}
    while engine.has_unfinished():
        finals.update((o.request_id, o) for o in engine.step().outputs if o.finished)
    return [finals[i] for i in ids]


def test_up_front_never_preempts_where_on_demand_does_and_both_stay_exact(model, tokenizer):
    prompts = make_prompts(3, 8)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    results = {}
    for policy in RESERVATION_POLICIES:
        engine = LLMEngine(model, tokenizer, config(block_size=4, num_blocks=24, max_num_seqs=8, max_model_len=64,
                                                    reservation_policy=policy))
        outs = run_to_end(engine, prompts, params)
        assert [list(o.token_ids) for o in outs] == [expected_ids(model, p, params) for p in prompts]
        results[policy] = (sum(len(r.preempted) for r in engine.trace), max(r.num_running for r in engine.trace))
        assert_clean(engine, len(prompts))
    assert results["on-demand"][0] > 0 and results["up-front"][0] == 0
    assert results["up-front"][1] < results["on-demand"][1]  # fewer requests fit when the output is promised


@pytest.mark.parametrize("policy", RESERVATION_POLICIES)
def test_every_exit_path_releases_the_reservation(model, tokenizer, policy):
    now = [0.0]
    engine = LLMEngine(model, tokenizer, config(block_size=4, num_blocks=30, max_model_len=64,
                                                reservation_policy=policy), clock=lambda: now[0])
    alloc = engine.allocator
    finished = engine.add_request([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    cancelled = engine.add_request([8, 9, 10, 11, 12], LONG)
    late = engine.add_request([13, 14], LONG, deadline_s=0.5)
    forked = engine.add_request([15, 16, 17, 18, 19], SamplingParams(temperature=1.0, max_tokens=4, n=2, seed=1))
    for _ in range(2):
        engine.step()
    promised = alloc.num_reserved_blocks
    assert (promised > 0) == (policy == "up-front")
    engine.cancel(cancelled)
    assert alloc.reserved_blocks(cancelled) == 0 and not alloc.has_sequence(cancelled)
    now[0] = 1.0  # past the deadline
    engine.step()
    assert alloc.reserved_blocks(late) == 0 and not alloc.has_sequence(late)
    while engine.has_unfinished():
        engine.step()
        alloc.inspect().check_invariants()
    states = {r.request_id: r.state for r in engine.ledger.records}
    assert states == {finished: RequestState.FINISHED, cancelled: RequestState.CANCELLED,
                      late: RequestState.TIMED_OUT, forked: RequestState.FINISHED}
    assert_clean(engine, 4)


def test_preemption_releases_the_victims_blocks_and_reservation(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, num_blocks=12, max_num_seqs=4, max_model_len=64))
    for prompt in make_prompts(11, 4):
        engine.add_request(prompt, LONG)
    victims = []
    while engine.has_unfinished():
        engine.step()
        for victim in engine.trace[-1].preempted:
            assert not engine.allocator.has_sequence(victim) and engine.allocator.reserved_blocks(victim) == 0
            victims.append(victim)
        engine.allocator.inspect().check_invariants()
    assert victims
    assert_clean(engine, 4)


def test_compare_reservation_policies_reports_the_trade(model, tokenizer):
    prompts = make_prompts(7, 12)
    result = compare_reservation_policies(model, tokenizer, prompts, [20] * len(prompts),
                                          config(block_size=4, num_blocks=32, max_num_seqs=8, max_model_len=64))
    on_demand, up_front = result["on-demand"], result["up-front"]
    assert on_demand["requests"] == up_front["requests"] == 12
    assert up_front["preemptions"] == 0 < on_demand["preemptions"]
    assert up_front["peak_running"] < on_demand["peak_running"]
    assert up_front["kv_reserved_mean"] > 0 == on_demand["kv_reserved_mean"]
    assert 0 < up_front["kv_used_mean"] <= up_front["kv_used_peak"] <= 1
    assert on_demand["tokens_per_step"] * on_demand["steps"] == pytest.approx(12 * 20, abs=0.01 * on_demand["steps"])
    with pytest.raises(ValueError, match="equal length"):
        compare_reservation_policies(model, tokenizer, prompts, [20], config())
