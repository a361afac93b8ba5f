"""servelab.engine: greedy equivalence with the full-recompute loop, scheduling, caching, preemption,
streaming, lifecycle cleanup and input validation. Small random-weight models keep it fast on CPU."""

import dataclasses
import json
import random

import pytest
import torch
from safetensors.torch import save_file

from servelab.engine import EngineConfig, LLMEngine, reference_generate
from servelab.lifecycle.state_machine import RequestState
from servelab.model import LlamaConfig, LlamaForCausalLM, train_tokenizer
from servelab.sampling import SamplingParams

torch.set_num_threads(1)

VOCAB = 300
EOS = 0
TEXT = ("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
        "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles\n") * 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXT, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      eos_token_id=EOS, bos_token_id=EOS, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper than the default init, so greedy choices have clear margins
        model.lm_head.weight.mul_(4)
    return model


def config(**overrides) -> EngineConfig:
    """Engine settings for tests: fp32 on whatever device the engine picks, so greedy ties stay exact, and
    tracing on (the last 10,000 steps): many tests read ``engine.trace``."""
    return EngineConfig(**{"dtype": "float32", "trace_steps": 10_000} | overrides)


def make_prompts(seed: int, count: int, shared_prefix: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(1, VOCAB) for _ in range(shared_prefix)]
    return [prefix + [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 30))] for _ in range(count)]


def expected_ids(model, prompt, params=GREEDY) -> list[int]:
    """What the engine should emit: the reference tokens, without a final EOS (never emitted)."""
    ref = reference_generate(model, prompt, params.max_tokens, eos_token_id=None if params.ignore_eos else EOS)
    return ref[:-1] if ref and ref[-1] == EOS and not params.ignore_eos else ref


def assert_clean(engine: LLMEngine, num_requests: int) -> None:
    """Every block free, refcounts zero, invariants hold, one terminal record per request, no slots held."""
    alloc = engine.allocator
    alloc.inspect().check_invariants()
    assert alloc.num_used_blocks == 0
    assert all(alloc.refcount(b) == 0 for b in range(alloc.num_blocks))
    assert alloc.num_reserved_blocks == 0
    assert engine.slots.in_use == 0
    assert engine.runner.host_swap is None or engine.runner.host_swap.in_use == 0
    ids = [r.request_id for r in engine.ledger.records]
    assert len(ids) == len(set(ids)) == num_requests
    assert not engine.has_unfinished()


def run_staggered(engine: LLMEngine, prompts, params=GREEDY, every: int = 2) -> dict:
    """Add one prompt every ``every`` steps (continuous batching), run to the end; id -> final output."""
    pending = list(enumerate(prompts))
    finals, step = {}, 0
    while pending or engine.has_unfinished():
        if pending and step % every == 0:
            i, prompt = pending.pop(0)
            engine.add_request(prompt, params, request_id=f"r{i}")
        for out in engine.step().outputs:
            if out.finished:
                finals[out.request_id] = out
        step += 1
    return finals


CONFIGS = [
    dict(block_size=1, max_num_batched_tokens=512),
    dict(block_size=4, max_num_batched_tokens=7),
    dict(block_size=16, max_num_batched_tokens=16, enable_prefix_caching=False),
    dict(block_size=4, max_num_batched_tokens=128, enable_chunked_prefill=False),
    dict(block_size=4, max_num_batched_tokens=12, max_num_seqs=3, policy="sjf"),
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_greedy_matches_reference(model, tokenizer, overrides):
    prompts = make_prompts(1, 6, shared_prefix=9)
    engine = LLMEngine(model, tokenizer, config(max_model_len=128, **overrides))
    finals = run_staggered(engine, prompts)
    for i, prompt in enumerate(prompts):
        assert list(finals[f"r{i}"].token_ids) == expected_ids(model, prompt), f"request r{i}"
    assert_clean(engine, len(prompts))


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_matches_reference_under_preemption(model, tokenizer, mode):
    prompts = make_prompts(2, 6, shared_prefix=5)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    engine = LLMEngine(model, tokenizer, config(block_size=4, num_blocks=16, max_num_batched_tokens=16,
                                                     preemption_mode=mode, max_model_len=128))
    finals = run_staggered(engine, prompts, params, every=1)
    for i, prompt in enumerate(prompts):
        assert list(finals[f"r{i}"].token_ids) == expected_ids(model, prompt, params), f"request r{i}"
    evicted = sum(len(t.swapped_out if mode == "swap" else t.preempted) for t in engine.trace)
    assert evicted > 0, "the tiny pool should have forced preemption"
    if mode == "swap":
        assert sum(len(t.swapped_in) for t in engine.trace) == evicted
    assert_clean(engine, len(prompts))


def test_prefix_cache_hits_skip_prefill_and_respect_namespaces(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128))
    prompt = make_prompts(3, 1)[0][:1] + list(range(1, 16))  # 16 tokens: four full blocks
    first = engine.generate([prompt], GREEDY)[0]
    again = engine.generate([prompt], GREEDY)[0]  # full hit: the last prompt token is recomputed
    other_tenant_id = engine.add_request(prompt, GREEDY, namespace="tenant-b")
    while engine.has_unfinished():
        for out in engine.step().outputs:
            if out.finished:
                other = out
    assert first.usage.cached_prompt_tokens == 0
    assert again.usage.cached_prompt_tokens == 15
    assert other.request_id == other_tenant_id and other.usage.cached_prompt_tokens == 0
    assert first.token_ids == again.token_ids == other.token_ids == tuple(expected_ids(model, prompt))
    assert_clean(engine, 3)


def test_identical_prompts_arriving_together_share_only_computed_blocks(model, tokenizer):
    prompt = make_prompts(4, 1, shared_prefix=24)[0]
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_num_batched_tokens=8, max_model_len=128))
    outs = engine.generate([prompt, prompt, prompt], GREEDY)
    assert all(list(o.token_ids) == expected_ids(model, prompt) for o in outs)
    assert max(o.usage.cached_prompt_tokens for o in outs) > 0
    assert_clean(engine, 3)


def test_a_prefill_cancelled_half_way_leaves_only_its_computed_blocks_to_hit(model, tokenizer):
    prompt = make_prompts(4, 1, shared_prefix=24)[0]
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_num_batched_tokens=8, max_model_len=128))
    abandoned = engine.add_request(prompt, GREEDY)
    engine.step()  # one 8-token chunk computed; the rest of the prompt's blocks are allocated, never written
    engine.cancel(abandoned)
    again = engine.generate([prompt], GREEDY)[0]
    assert again.usage.cached_prompt_tokens == 8  # the two computed blocks hit; the unwritten ones are recomputed
    assert list(again.token_ids) == expected_ids(model, prompt)
    assert_clean(engine, 2)


def test_seeded_sampling_is_reproducible_and_independent_of_batch(model, tokenizer):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=123, ignore_eos=True)
    prompt = make_prompts(5, 1)[0]
    alone = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128)).generate([prompt], params)[0]
    crowd = LLMEngine(model, tokenizer, config(block_size=8, max_num_batched_tokens=9, max_model_len=128))
    others = make_prompts(6, 4)
    outs = crowd.generate(others[:2] + [prompt] + others[2:],
                          [SamplingParams(temperature=1.0, max_tokens=12)] * 2 + [params]
                          + [SamplingParams(temperature=0.7, max_tokens=5)] * 2)
    assert outs[2].token_ids == alone.token_ids
    assert len(set(alone.token_ids)) > 2  # really sampled, not a collapsed distribution
    unseeded = LLMEngine(model, tokenizer, config(max_model_len=128, seed=1))
    a, b = unseeded.generate([prompt, prompt], SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True))
    assert a.token_ids != b.token_ids  # distinct per-request seeds drawn from the engine's seed


def test_stop_string_across_tokens_and_streaming(model, tokenizer):
    prompt = make_prompts(7, 1)[0]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    engine = LLMEngine(model, tokenizer, config(max_model_len=128))
    full = engine.generate([prompt], params)[0]
    ids = list(full.token_ids)
    pieces = [tokenizer.decode(ids[:i]) for i in range(len(ids) + 1)]
    cut = next(i for i in range(3, len(ids)) if len(pieces[i]) - len(pieces[i - 2]) >= 2
               and pieces[i][:len(pieces[i - 1])] == pieces[i - 1])
    stop = pieces[cut][len(pieces[cut - 2]) - 1:len(pieces[cut - 1]) + 1]  # spans a token boundary
    expected = full.text[:full.text.index(stop)]
    stopped = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=(stop,))
    out = engine.generate([prompt], stopped)[0]
    assert out.finish_reason == "stop" and out.text == expected
    assert out.usage.emitted_tokens < out.usage.generated_tokens  # the ids carrying the stop string are not handed out
    assert tokenizer.decode(list(out.token_ids)).startswith(expected)
    assert "".join(engine.stream(prompt, stopped)) == expected
    stream = engine.stream(prompt, params)
    next(stream)
    stream.close()  # a client disconnect cancels the request
    assert engine.ledger.records[-1].state is RequestState.CANCELLED
    assert_clean(engine, 4)


def test_finish_reasons_usage_and_timing(model, tokenizer):
    now = [0.0]

    def clock():
        now[0] += 0.5
        return now[0]

    engine = LLMEngine(model, tokenizer, config(max_model_len=40), clock=clock)
    long = make_prompts(8, 1)[0][:30]
    length = engine.add_request(long, SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True))
    late = engine.add_request([1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True), deadline_s=3.0)
    waiting = engine.add_request([4, 5], GREEDY)
    assert engine.cancel(waiting) is True
    finals = {}
    while engine.has_unfinished():
        finals.update({o.request_id: o for o in engine.step().outputs if o.finished})
    assert finals[length].finish_reason == "length" and finals[length].usage.generated_tokens == 40 - len(long)
    assert finals[late].finish_reason == "timed_out"
    assert finals[waiting].finish_reason == "cancelled" and finals[waiting].timing is None
    done = finals[length]
    assert done.usage.emitted_tokens == done.usage.generated_tokens and done.usage.committed_tokens == 39
    assert done.timing.ttft > 0 and len(done.timing.itl) == done.usage.emitted_tokens - 1
    states = {r.request_id: r.state for r in engine.ledger.records}
    assert states == {length: RequestState.FINISHED, late: RequestState.TIMED_OUT, waiting: RequestState.CANCELLED}
    assert engine.cancel(waiting) is False
    assert_clean(engine, 3)


@pytest.mark.parametrize("policy", ["on-demand", "up-front"])  # the reservation policy: released either way
def test_forward_failure_fails_and_reclaims_the_batch(model, tokenizer, policy):
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128, reservation_policy=policy))
    ids = [engine.add_request(p, GREEDY) for p in make_prompts(9, 3)]
    engine.step()
    original = engine.runner.execute
    engine.runner.execute = lambda rows: (_ for _ in ()).throw(RuntimeError("device lost"))
    outs = engine.step().outputs
    engine.runner.execute = original
    assert sorted(o.request_id for o in outs) == sorted(ids)
    assert all(o.finish_reason == "failed" for o in outs)
    assert all(r.state is RequestState.FAILED and "device lost" in r.reason for r in engine.ledger.records)
    assert_clean(engine, 3)


@pytest.mark.parametrize("policy", ["on-demand", "up-front"])  # the reservation policy: up front never preempts
@pytest.mark.parametrize("seed", range(6))
def test_fuzzed_workload_leaves_nothing_behind(model, tokenizer, seed, policy):
    rng = random.Random(seed)
    now = [0.0]
    block_size = rng.choice([1, 2, 4])
    engine = LLMEngine(model, tokenizer, config(  # the pool holds one longest request, plus 0-8 blocks
        block_size=block_size, num_blocks=64 // block_size + rng.choice([0, 8]), max_num_seqs=rng.choice([2, 4, 8]),
        max_num_batched_tokens=rng.choice([8, 32]), preemption_mode=rng.choice(["recompute", "swap"]),
        swap_space_bytes=rng.choice([0, 4096, 1 << 20]), enable_prefix_caching=rng.random() < 0.7,
        policy=rng.choice(["fcfs", "priority", "sjf"]), max_model_len=64, reservation_policy=policy),
        clock=lambda: now[0])
    issued, live = 0, []
    for step in range(120):
        now[0] += 0.01
        if rng.random() < 0.3:
            prompt = make_prompts(rng.randrange(4), 1, shared_prefix=rng.choice([0, 8]))[0]
            params = SamplingParams(temperature=rng.choice([0.0, 1.0]), max_tokens=rng.randrange(1, 20),
                                    stop=rng.choice([(), ("e",)]), ignore_eos=rng.random() < 0.5)
            live.append(engine.add_request(prompt, params, deadline_s=rng.choice([None, 0.2]),
                                           priority=rng.randrange(3)))
            issued += 1
        if live and rng.random() < 0.1:
            engine.cancel(live.pop(rng.randrange(len(live))))
        engine.step()
        engine.allocator.inspect().check_invariants()
    while engine.has_unfinished():
        engine.step()
    assert policy == "on-demand" or not any(r.preempted or r.swapped_out for r in engine.trace)
    assert_clean(engine, issued)


def test_bad_input_is_rejected(model, tokenizer, tmp_path):
    engine = LLMEngine(model, tokenizer, config(block_size=4, num_blocks=8, max_model_len=64))
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request("", GREEDY)
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request([], GREEDY)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(list(range(1, 65)), GREEDY)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.add_request([VOCAB + 5], GREEDY)
    with pytest.raises(ValueError, match="max_tokens"):
        engine.add_request([1, 2], SamplingParams(max_tokens=0))
    with pytest.raises(ValueError, match="top_p"):
        engine.add_request([1, 2], SamplingParams(top_p=1.5))
    with pytest.raises(ValueError, match="KV blocks"):
        engine.add_request([1, 2], SamplingParams(max_tokens=60))
    with pytest.raises(TypeError, match="params"):
        engine.add_request([1, 2], {"temperature": 0})
    with pytest.raises(ValueError, match="prompt"):  # nothing of a rejected batch stays queued
        engine.generate([[1, 2], []], GREEDY)
    assert not engine.has_unfinished()
    with pytest.raises(ValueError, match="deadline_s"):
        engine.add_request([1, 2], GREEDY, deadline_s=-1)
    engine.add_request([1, 2], GREEDY, request_id="dup")
    with pytest.raises(ValueError, match="dup"):
        engine.add_request([1, 2], GREEDY, request_id="dup")
    with pytest.raises(KeyError, match="nope"):
        engine.cancel("nope")
    with pytest.raises(ValueError, match="preemption_mode"):
        EngineConfig(preemption_mode="evict")
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(block_size=0)
    with pytest.raises(ValueError, match="device"):
        LLMEngine(model, tokenizer, config(device="tpu-9"))
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        LLMEngine(model, tokenizer, config(enable_chunked_prefill=False, max_num_batched_tokens=16))
    with pytest.raises(TypeError, match="model"):
        LLMEngine(torch.nn.Linear(2, 2), tokenizer)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10, "n_embd": 8}))
    save_file({"wte.weight": torch.zeros(10, 8)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError):
        LLMEngine.from_pretrained(tmp_path)


def test_greedy_matches_transformers_generate(model, tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    from servelab.model import save_checkpoint

    save_checkpoint(model, tmp_path)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    prompt = make_prompts(10, 1)[0]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ours = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128)).generate([prompt], params)[0]
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert list(ours.token_ids) == theirs


def test_trace_shows_mixed_batches_under_the_token_budget(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_num_batched_tokens=8, max_model_len=128))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    shorts = [engine.add_request(p[:3], params) for p in make_prompts(11, 2)]
    engine.step()
    tick = engine.last_schedule  # one scheduler tick: both 3-token prompts whole, first tokens sampled
    assert [(c.seq_id, c.start, c.num_tokens, c.emits_token) for c in tick.chunks] == [(s, 0, 3, True) for s in shorts]
    assert tick.admitted == shorts and tick.num_batched_tokens == 6
    long = engine.add_request(make_prompts(12, 1, shared_prefix=40)[0], params)
    while engine.has_unfinished():
        engine.step()
    assert all(r.num_batched_tokens <= 8 for r in engine.trace)
    mixed = [r for r in engine.trace if long in r.prefill_tokens and set(shorts) & set(r.decode_tokens)]
    assert len(mixed) >= 2, "the long prompt is prefilled in chunks next to running decodes"
    row = engine.trace[1].to_dict()
    assert {"step", "start", "end", "duration", "blocks_used", "blocks_free", "blocks_shared"} <= set(row)


def test_budget_deschedules_and_priority_picks_the_victim(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_num_batched_tokens=4, policy="priority",
                                                     max_model_len=128))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    background = engine.add_request([3, 4], params, priority=5)
    engine.step()
    engine.add_request(make_prompts(13, 1, shared_prefix=30)[0], params, priority=0)
    while engine.has_unfinished():
        engine.step()
    assert any(background in r.descheduled for r in engine.trace), "the urgent prefill takes the whole budget"
    assert_clean(engine, 2)

    engine = LLMEngine(model, tokenizer, config(block_size=2, num_blocks=16, policy="priority",
                                                     max_model_len=32))
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    important = engine.add_request([5, 6, 7], params, priority=0)
    casual = engine.add_request([8, 9, 10], params, priority=5)
    while engine.has_unfinished():
        engine.step()
    preempted = [s for r in engine.trace for s in r.preempted]
    assert preempted and set(preempted) == {casual} and important not in preempted
    assert_clean(engine, 2)


def test_incremental_detokenizer_holds_back_split_characters(tokenizer):
    from servelab.engine.sequence import IncrementalDetokenizer

    ids = tokenizer.encode("to é").ids
    assert tokenizer.decode(ids[:-1]).endswith("\ufffd")  # the last character spans two byte tokens
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.update(ids[:i]) for i in range(1, len(ids) + 1)]
    assert "\ufffd" not in "".join(pieces) and "".join(pieces) == "to é"
    assert pieces[-2] == ""
    rng = random.Random(0)
    for _ in range(20):  # any id sequence: the deltas plus the final flush rebuild the full decode
        ids = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 30))]
        detok = IncrementalDetokenizer(tokenizer)
        text = "".join(detok.update(ids[:i]) for i in range(1, len(ids) + 1)) + detok.update(ids, final=True)
        assert text == tokenizer.decode(ids)


def test_shipped_model_through_from_pretrained():
    from servelab.model import default_model_dir

    if not (default_model_dir() / "model.safetensors").is_file():
        pytest.skip("the shipped checkpoint is not in this checkout")
    engine = LLMEngine.from_pretrained(num_blocks=64)
    prompt = "ROMEO:\n"
    out = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0]
    ids = engine.tokenizer.encode(prompt).ids
    assert list(out.token_ids) == reference_generate(engine.runner.model, ids, 8)
    assert out.text == engine.tokenizer.decode(list(out.token_ids))


def decoding_pair(engine: LLMEngine, params: SamplingParams) -> tuple[str, str]:
    """Two requests, stepped until both are in decode."""
    ids = engine.add_request(make_prompts(14, 1)[0], params), engine.add_request(make_prompts(15, 1)[0], params)
    for _ in range(3):
        engine.step()
    assert all(engine.state(i) is RequestState.DECODE for i in ids)
    return ids


def test_paused_request_keeps_its_blocks_and_resumes_exactly(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128))
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    paused, other = decoding_pair(engine, params)
    assert engine.pause(paused) is True
    assert engine.state(paused) is RequestState.BACKPRESSURED
    table, held = engine.allocator.block_table(paused), engine.allocator.num_tokens(paused)
    slots = engine.slots.in_use
    other_before = len(engine._requests[other].seq.output_ids)
    records = []
    for _ in range(5):
        engine.step()
        records.append(engine.trace[-1])
        assert engine.allocator.block_table(paused) == table and engine.allocator.num_tokens(paused) == held
        assert engine.slots.in_use == slots
    assert all(paused in r.paused and paused not in r.descheduled for r in records)
    assert not any(paused in r.decode_tokens or paused in r.prefill_tokens for r in records)
    assert len(engine._requests[other].seq.output_ids) == other_before + 5
    assert engine.resume(paused) is True
    assert engine.state(paused) is RequestState.DECODE
    finals = {}
    while engine.has_unfinished():
        finals.update({o.request_id: o for o in engine.step().outputs if o.finished})
    for request_id, seed in ((paused, 14), (other, 15)):
        assert list(finals[request_id].token_ids) == expected_ids(model, make_prompts(seed, 1)[0], params)
    assert_clean(engine, 2)


def test_paused_waiting_request_is_neither_admitted_nor_failed(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128))
    queued = engine.add_request(make_prompts(16, 1)[0], GREEDY)
    engine.pause(queued)
    for _ in range(3):
        assert engine.step().outputs == []
    assert engine.allocator.num_used_blocks == 0 and engine.state(queued) is RequestState.VALIDATED
    engine.resume(queued)
    finals = []
    while engine.has_unfinished():
        finals += [o for o in engine.step().outputs if o.finished]
    assert list(finals[0].token_ids) == expected_ids(model, make_prompts(16, 1)[0])
    assert_clean(engine, 1)


def test_cancel_while_paused_frees_every_block(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128))
    paused, other = decoding_pair(engine, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    engine.pause(paused)
    engine.step()
    held = len(engine.allocator.block_table(paused))
    used = engine.allocator.num_used_blocks
    assert engine.cancel(paused) is True
    engine.allocator.inspect().check_invariants()
    assert not engine.allocator.has_sequence(paused) and engine.allocator.num_used_blocks == used - held
    record = engine.ledger.records[-1]
    assert (record.request_id, record.state, record.from_state) == (paused, RequestState.CANCELLED,
                                                                    RequestState.BACKPRESSURED)
    assert record.blocks_freed == held and record.slots_released == 1
    finals = {}
    while engine.has_unfinished():
        finals.update({o.request_id: o for o in engine.step().outputs if o.finished})
    assert finals[paused].finish_reason == "cancelled" and finals[other].finish_reason == "length"
    assert engine.pause(paused) is False and engine.resume(paused) is False
    assert_clean(engine, 2)


def test_deadline_while_paused_times_out_once(model, tokenizer):
    now = [0.0]
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128), clock=lambda: now[0])
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    late = engine.add_request(make_prompts(17, 1)[0], params, deadline_s=1.0)
    engine.step()
    engine.step()
    engine.pause(late)
    engine.step()
    assert engine.allocator.num_used_blocks > 0
    now[0] = 2.0
    outs = engine.step().outputs
    assert [(o.request_id, o.finish_reason) for o in outs] == [(late, "timed_out")]
    records = [r for r in engine.ledger.records if r.request_id == late]
    assert len(records) == 1 and records[0].state is RequestState.TIMED_OUT
    assert records[0].from_state is RequestState.BACKPRESSURED
    assert engine.cancel(late) is False and engine.resume(late) is False
    assert_clean(engine, 1)


def test_pause_and_resume_unknown_ids_raise(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128))
    with pytest.raises(KeyError, match="nope"):
        engine.pause("nope")
    with pytest.raises(KeyError, match="nope"):
        engine.resume("nope")


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_paused_requests_under_memory_pressure_still_match_and_leave_nothing(model, tokenizer, mode):
    """Pausing frees no memory: paused requests may still be preempted, and resume where they stopped."""
    rng = random.Random(mode)
    prompts = make_prompts(18, 5)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    engine = LLMEngine(model, tokenizer, config(block_size=4, num_blocks=16, max_num_batched_tokens=16,
                                                     preemption_mode=mode, max_model_len=128))
    ids = [engine.add_request(p, params, request_id=f"r{i}") for i, p in enumerate(prompts)]
    finals = {}
    while engine.has_unfinished():
        live = [i for i in ids if i not in finals]
        if rng.random() < 0.3:
            engine.pause(rng.choice(live))
        if rng.random() < 0.4:
            engine.resume(rng.choice(live))
        if all(engine._requests[i].seq.paused for i in live if i in engine._requests):
            engine.resume(live[0])
        finals.update({o.request_id: o for o in engine.step().outputs if o.finished})
        engine.allocator.inspect().check_invariants()
    assert any(r.paused for r in engine.trace)
    assert any(r.preempted or r.swapped_out for r in engine.trace)
    for i, prompt in enumerate(prompts):
        assert list(finals[f"r{i}"].token_ids) == expected_ids(model, prompt, params), f"request r{i}"
    assert_clean(engine, len(prompts))


# ----------------------------------------------------------------------------- parallel sampling (n > 1)


def sample_ids(output) -> list[list[int]]:
    return [list(s.token_ids) for s in output.samples]


@pytest.mark.parametrize("overrides", CONFIGS[:4], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_greedy_parallel_samples_all_match_reference(model, tokenizer, overrides):
    prompts = make_prompts(11, 3, shared_prefix=6)
    engine = LLMEngine(model, tokenizer, config(max_model_len=128, **overrides))
    params = SamplingParams(temperature=0.0, max_tokens=10, n=3)
    finals = run_staggered(engine, prompts, params)
    for i, prompt in enumerate(prompts):
        out = finals[f"r{i}"]
        assert [s.index for s in out.samples] == [0, 1, 2] and all(s.finished for s in out.samples)
        assert sample_ids(out) == [expected_ids(model, prompt)] * 3, f"request r{i}"
        assert list(out.token_ids) == expected_ids(model, prompt) and out.text == out.samples[0].text
        assert out.usage.generated_tokens == sum(len(s.token_ids) + (s.finish_reason == "eos") for s in out.samples)
        assert out.usage.prompt_tokens == len(prompt)
    assert_clean(engine, len(prompts))
    assert all(r.usage.generated_tokens == finals[r.request_id].usage.generated_tokens for r in engine.ledger.records)


def test_single_sample_output_has_no_samples(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(max_model_len=128))
    out = engine.generate([make_prompts(12, 1)[0]], GREEDY)[0]
    assert out.samples == () and out.timing is not None


def test_seeded_parallel_sample_i_equals_a_single_request_seeded_seed_plus_i(model, tokenizer):
    prompt = make_prompts(13, 1)[0]
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=40, ignore_eos=True, n=4)
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_num_batched_tokens=9, max_model_len=128))
    out = engine.generate([prompt, make_prompts(14, 1)[0]], [seeded, GREEDY])[0]
    alone = LLMEngine(model, tokenizer, config(block_size=8, max_model_len=128))
    singles = alone.generate([prompt] * 4, [dataclasses.replace(seeded, n=1, seed=40 + i) for i in range(4)])
    assert sample_ids(out) == [list(s.token_ids) for s in singles]
    assert len({tuple(ids) for ids in sample_ids(out)}) > 1  # really different samples
    assert out.usage.generated_tokens == 4 * 12 and out.finish_reason == "length"
    assert_clean(engine, 2)


def test_parallel_samples_share_the_prompt_blocks(model, tokenizer):
    from servelab.kv import physical_blocks_no_sharing

    prompt = make_prompts(15, 1, shared_prefix=10)[0][:10]  # 10 tokens: two full blocks and a partial tail
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128))
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, n=3),
                       request_id="b")
    for _ in range(4):  # prefill + fork, then a few decode steps
        engine.step()
    seqs = engine._requests["b"].seqs
    assert all(len(seq.output_ids) == 4 for seq in seqs)
    tables = [engine.allocator.block_table(seq.seq_id) for seq in seqs]
    assert tables[0][:2] == tables[1][:2] == tables[2][:2]
    assert [engine.allocator.refcount(b) for b in tables[0][:2]] == [3, 3]
    assert len({t[2] for t in tables}) == 3  # the shared partial tail was copied on write
    separate = physical_blocks_no_sharing([seq.num_tokens for seq in seqs], 4)
    assert engine.allocator.num_used_blocks == 2 + 3 * 2 < separate == 12
    assert any(rec.blocks_shared == 2 for rec in engine.trace)
    while engine.has_unfinished():
        engine.step()
    assert_clean(engine, 1)


def test_cancelling_a_parallel_request_mid_decode_frees_every_sample(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128))
    params = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True, n=3)
    engine.add_request(make_prompts(16, 1)[0], params, request_id="c")
    for _ in range(3):  # prefill + fork (one token per sample), then two decode steps
        engine.step()
    assert engine.allocator.num_used_blocks > 0 and engine.slots.in_use == 3
    assert engine.cancel("c")
    final = [o for o in engine.step().outputs if o.request_id == "c"][0]
    assert final.finished and final.finish_reason == "cancelled"
    assert [s.finish_reason for s in final.samples] == ["cancelled"] * 3
    record = engine.ledger.records[0]
    assert record.slots_released == 3 and record.usage.generated_tokens == final.usage.generated_tokens == 3 * 3
    assert_clean(engine, 1)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_parallel_samples_under_preemption_still_match(model, tokenizer, mode):
    prompts = make_prompts(17, 2)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, n=3)
    engine = LLMEngine(model, tokenizer, config(block_size=4, num_blocks=10, max_num_batched_tokens=16,
                                                preemption_mode=mode, max_model_len=128))
    finals = run_staggered(engine, prompts, params, every=1)
    for i, prompt in enumerate(prompts):
        assert sample_ids(finals[f"r{i}"]) == [expected_ids(model, prompt, params)] * 3, f"request r{i}"
    evicted = [s for t in engine.trace for s in (t.swapped_out if mode == "swap" else t.preempted)]
    assert any("/" in seq_id for seq_id in evicted), "a forked sample should have been preempted"
    assert_clean(engine, len(prompts))


def test_n_beyond_the_batch_slots_is_rejected_and_beyond_the_pool_waits(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, num_blocks=5, max_num_seqs=4, max_model_len=128))
    with pytest.raises(ValueError, match="max_num_seqs"):
        engine.add_request([1, 2, 3], SamplingParams(n=5))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, n=4)  # 4 x 4 blocks > 5
    out = engine.generate([[1, 2, 3, 4, 5]], params)[0]
    assert sample_ids(out) == [expected_ids(model, [1, 2, 3, 4, 5], params)] * 4
    assert_clean(engine, 1)


def test_quick_benchmark_runs_every_section_and_agrees(model, tokenizer, tmp_path):
    pytest.importorskip("transformers")
    from servelab.bench import engine_bench
    from servelab.model import save_checkpoint

    save_checkpoint(model, tmp_path)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    result = engine_bench.run(quick=True, model_dir=str(tmp_path))
    assert result["batch1"]["outputs_agree"]  # engine, no-cache loop and transformers: same greedy tokens
    assert set(result["targets_met"]) == {"batch1_parity_with_generate", "skewed_2x_generate",
                                          "continuous_1.5x_static"}
    assert set(result["step_cost"]["step_s"]) == {"1", "8", "32"}
    assert all(t > 0 for t in result["step_cost"]["step_s"].values())
    labels = [label for label, _ in engine_bench.summary_rows(result)]
    assert sum(label.startswith("one decode step") for label in labels) == 3
    assert engine_bench.hardware_line(result) in engine_bench.format_table(result)


def test_tracing_off_still_reports_admissions_and_the_ledger_stays_bounded(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128, max_num_seqs=2,
                                                trace_steps=0, ledger_size=2))
    prompts = make_prompts(31, 4)
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    admitted, ended = [], []
    while engine.has_unfinished():
        outputs = engine.step()
        admitted += outputs.admitted
        ended += [o.request_id for o in outputs.outputs if o.finished]
    assert sorted(admitted) == sorted(ids) and len(engine.trace) == 0 and engine.num_steps > 0
    assert [r.request_id for r in engine.ledger.records] == ended[-2:]  # only the most recent records kept
    assert engine.stats().ended.by_state == {RequestState.FINISHED: 4}  # totals cover the dropped records
    assert engine.state(ended[-1]) is RequestState.FINISHED
    with pytest.raises(ValueError, match="already in use"):  # an id in the window is still taken
        engine.add_request(prompts[0], GREEDY, request_id=ended[-1])
    with pytest.raises(KeyError, match="unknown"):  # an id whose record left the window is forgotten ...
        engine.cancel(ended[0])
    assert engine.add_request(prompts[0], GREEDY, request_id=ended[0]) == ended[0]  # ... and may be used again
    while engine.has_unfinished():
        engine.step()
    assert engine.allocator.num_used_blocks == 0 and engine.slots.in_use == 0
