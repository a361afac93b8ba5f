"""vLLM V1's scheduling rules in the engine: ``reservation_policy="per-step"`` (blocks only for
the tokens each step schedules) and preemption by recompute whose victim's full blocks stay in the
prefix cache.

Greedy tokens must not depend on the rule, however often the tiny pool preempts; every block goes
back at the end. The shipped tiny model runs the mixed batch; the random-weight fixtures of
test_engine the rest."""

import pytest
import torch

from servelab.engine import EngineConfig, LLMEngine
from servelab.engine.admission import reservation_policy
from servelab.engine.config import RESERVATION_POLICIES
from servelab.kv.arithmetic import blocks_for
from servelab.sampling import SamplingParams

from test_engine import (assert_clean, config, expected_ids, make_prompts,  # noqa: F401 (fixtures)
                         model, tokenizer)

LONG = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def run_to_end(engine: LLMEngine, prompts, params) -> list[list[int]]:
    ids = [engine.add_request(p, params if isinstance(params, SamplingParams) else params[i])
           for i, p in enumerate(prompts)]
    finals = {}
    while engine.has_unfinished():
        finals.update((o.request_id, o) for o in engine.step().outputs if o.finished)
    return [list(finals[i].token_ids) for i in ids]


def test_per_step_is_accepted_and_a_bad_name_still_names_the_allowed_ones():
    assert "per-step" in RESERVATION_POLICIES
    assert EngineConfig(reservation_policy="per-step").reservation_policy == "per-step"
    rule = reservation_policy("per-step", 4, 64)
    assert rule.preempts and rule.output_blocks(6, 20, 1) == 0
    assert rule.slots_at_admission(40, 12) == 12  # only the first chunk's slots
    on_demand = reservation_policy("on-demand", 4, 64)
    assert on_demand.slots_at_admission(40, 12) == 40  # the whole prompt
    for bad in ("lazy", "per_step"):
        with pytest.raises(ValueError, match=r"reservation_policy must be one of .*'per-step'"):
            EngineConfig(reservation_policy=bad)


def test_per_step_allocates_a_long_prompt_a_chunk_at_a_time(model, tokenizer):
    prompt = make_prompts(21, 1)[0][:1] * 40  # 40 tokens, an 8-token budget: five chunks
    blocks = {}
    for policy in ("on-demand", "per-step"):
        engine = LLMEngine(model, tokenizer, config(
            block_size=4, num_blocks=40, max_num_batched_tokens=8, max_model_len=64,
            reservation_policy=policy, enable_prefix_caching=False))
        request = engine.add_request(prompt, LONG)
        held = []
        for _ in range(5):
            engine.step()
            held.append(len(engine.allocator.block_table(request)))
        blocks[policy] = held
        while engine.has_unfinished():
            engine.step()
        assert_clean(engine, 1)
    assert blocks["on-demand"] == [10] * 5  # the whole prompt's blocks from admission
    # each step's chunk only
    assert blocks["per-step"] == [blocks_for(8 * (i + 1), 4) for i in range(5)]


@pytest.fixture(scope="module")
def shipped():
    from servelab.model import default_model_dir, load_checkpoint, load_tokenizer

    if not (default_model_dir() / "model.safetensors").is_file():
        pytest.skip("the shipped checkpoint is not in servelab/assets")
    return load_checkpoint(device="cpu", dtype=torch.float32), load_tokenizer()


def test_greedy_tokens_equal_under_all_three_rules_on_a_mixed_batch_that_preempts(shipped):
    model, tokenizer = shipped
    lines = ["ROMEO:", "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?",
             "To be, or not to be, that is the question:",
             "First Citizen:\nBefore we proceed any further, hear",
             "KING RICHARD III:\nNow is the winter of our discontent", "HAMLET:"]
    prompts = [tokenizer.encode(line).ids for line in lines]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
              for n in (40, 12, 30, 8, 36, 24)]
    tokens, preempted = {}, {}
    for policy in RESERVATION_POLICIES:
        engine = LLMEngine(model, tokenizer, EngineConfig(
            block_size=4, num_blocks=24, max_num_seqs=6, max_num_batched_tokens=16, dtype="float32",
            reservation_policy=policy))
        tokens[policy] = run_to_end(engine, prompts, params)
        preempted[policy] = engine.stats().preemption.num_preemptions
        assert_clean(engine, len(prompts))
    assert tokens["per-step"] == tokens["on-demand"] == tokens["up-front"]
    assert all(len(t) == p.max_tokens for t, p in zip(tokens["per-step"], params))
    assert preempted["per-step"] > 0 and preempted["on-demand"] > 0 and preempted["up-front"] == 0


@pytest.mark.parametrize("policy", ["on-demand", "per-step"])
def test_readmission_hits_the_victims_cached_blocks_and_recomputes_the_rest(model, tokenizer,
                                                                             policy):
    prompts = make_prompts(2, 6, shared_prefix=5)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    stats, tokens = {}, {}
    for caching in (False, True):
        engine = LLMEngine(model, tokenizer, config(
            block_size=4, num_blocks=16, max_num_batched_tokens=16, max_model_len=128,
            reservation_policy=policy, enable_prefix_caching=caching))
        tokens[caching] = run_to_end(engine, prompts, params)
        stats[caching] = engine.stats().preemption
        assert_clean(engine, len(prompts))
    assert tokens[True] == tokens[False] == [expected_ids(model, p, params) for p in prompts]
    off, on = stats[False], stats[True]
    assert off.num_preemptions > 0 and on.num_preemptions > 0
    assert off.preempted_hits == 0
    assert off.recomputed_tokens == off.dropped_tokens  # all of it again
    assert 0 < on.preempted_hits <= on.preempted_queries and on.preempted_requests > 0
    assert on.recomputed_tokens < on.dropped_tokens  # the hits were not computed again
    assert on.recomputed_tokens / on.num_preemptions < off.recomputed_tokens / off.num_preemptions
    assert 0 < on.hit_rate <= 1 and off.hit_rate == 0


def test_a_victims_full_blocks_stay_cached_and_its_tail_goes_first(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, num_blocks=40, max_model_len=64,
                                                reservation_policy="per-step"))
    request = engine.add_request(list(range(1, 11)), LONG)  # 10 tokens: two full blocks and a tail
    for _ in range(4):  # the prompt, then three decode steps: 14 tokens, 13 with KV
        engine.step()
    seq = engine._requests[request].seq
    table = engine.allocator.block_table(request)
    out = type(engine.last_schedule)()
    engine.scheduler._preempt(seq, out)  # what a full pool would do
    keys = engine.allocator.block_keys()
    assert all(b in keys for b in table[:3])  # the 3 computed full blocks stay cached
    assert table[3] not in keys
    engine.allocator.allocate_prompt("probe", [97, 98, 99])
    assert engine.allocator.block_table("probe") == [table[3]]  # the uncached tail is reused first
    engine.allocator.free("probe")
    assert engine.allocator.lookup_prefix(seq.token_ids, seq.namespace) == 12
    engine.step()  # readmitted: the 12 cached tokens hit; position 12 again, then 13
    stats = engine.stats().preemption
    assert (stats.num_preemptions, stats.dropped_tokens, stats.preempted_requests) == (1, 13, 1)
    assert (stats.preempted_queries, stats.preempted_hits, stats.recomputed_tokens) == (14, 12, 1)
    engine.cancel(request)
    engine.step()
    assert_clean(engine, 1)


@pytest.mark.filterwarnings("ignore:p99 from only")
def test_the_study_reports_recompute_and_times_each_rule_against_on_demand(model, tokenizer):
    from servelab.bench.admission_study import compare_reservation_policies, time_reservation_policies

    prompts = [p * 3 for p in make_prompts(7, 6)]  # long enough to be prefilled in chunks
    budget = config(block_size=4, num_blocks=24, max_num_seqs=6, max_num_batched_tokens=16,
                    max_model_len=128)
    runs = compare_reservation_policies(model, tokenizer, prompts, [12] * len(prompts), budget)
    assert set(runs) == set(RESERVATION_POLICIES)
    assert runs["up-front"]["recomputed_tokens"] == runs["up-front"]["preempted_hits"] == 0
    for policy in ("on-demand", "per-step"):
        r = runs[policy]
        assert r["preemptions"] > 0 and 0 < r["preempted_hit_rate"] <= 1
        assert 1 <= r["ttft_mean_steps"] <= r["ttft_p99_steps"] and r["ttft_mean_s"] > 0
    timed = time_reservation_policies(model, tokenizer, prompts[:2], [4, 4], budget, repeats=3,
                                      warmup=0)
    assert set(timed) == {"up-front", "per-step"}
    assert all(c.ratio > 0 and c.band[0] <= c.band[1] for t in timed.values() for c in t.values())
    with pytest.raises(ValueError, match="baseline"):
        time_reservation_policies(model, tokenizer, prompts, [4] * 6, budget, baseline="fcfs")


def test_per_step_stays_exact_with_speculative_drafts_under_preemption(model, tokenizer):
    phrases = [p[:6] for p in make_prompts(11, 6)]
    prompts = [phrase * 4 for phrase in phrases]  # repeated phrases: n-gram lookup finds drafts
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    engine = LLMEngine(model, tokenizer, config(
        block_size=4, num_blocks=24, max_num_batched_tokens=24, max_model_len=128,
        reservation_policy="per-step",
        speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                            "prompt_lookup_min": 1}))
    assert run_to_end(engine, prompts, params) == [expected_ids(model, p, params) for p in prompts]
    assert engine.stats().preemption.num_preemptions > 0
    assert engine.stats().spec_decoding.num_draft_tokens > 0
    assert_clean(engine, len(prompts))
