"""Speculative decoding inside the engine: configs refused clearly, greedy output token-identical with and
without speculation (mixed batches, preemption, prefix cache, draft model), the sampled distribution equal
to the target's, stops / logprobs / n > 1 exact, rollback leaving no block behind under a fuzz."""

import random
import types

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from servelab.engine import EngineConfig, LLMEngine, reference_generate
from servelab.engine.sampler import SamplingRow, next_token_probs
from servelab.engine.spec_config import SpeculativeConfig, speculative_config
from servelab.engine.spec_verify import SpecDecodingStats, verify
from servelab.kv.arithmetic import blocks_for
from servelab.model import LlamaConfig, LlamaForCausalLM, train_tokenizer
from servelab.sampling import SamplingParams

torch.set_num_threads(1)

VOCAB = 300
EOS = 0
TEXT = ("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
        "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles\n") * 10
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXT, vocab_size=VOCAB)


def small_llama(seed: int, hidden: int = 64, layers: int = 2, vocab: int = VOCAB) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=EOS, bos_token_id=EOS, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper than the default init, so greedy choices have clear margins
        model.lm_head.weight.mul_(4)
    return model


@pytest.fixture(scope="module")
def model():
    return small_llama(0)


def config(**overrides) -> EngineConfig:
    return EngineConfig(**{"dtype": "float32", "trace_steps": 10_000, "max_model_len": 160} | overrides)


def copy_heavy(seed: int, count: int) -> list[list[int]]:
    """Prompts that repeat a random phrase (what n-gram lookup finds), mixed with plain random ones."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        phrase = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(3, 9))]
        prompts.append(phrase * rng.randrange(2, 5) if i % 3 else [rng.randrange(1, VOCAB) for _ in range(20)])
    return prompts


def expected_ids(model, prompt, params) -> list[int]:
    ref = reference_generate(model, prompt, params.max_tokens, eos_token_id=None if params.ignore_eos else EOS)
    return ref[:-1] if ref and ref[-1] == EOS and not params.ignore_eos else ref


def run_staggered(engine: LLMEngine, prompts, params, every: int = 2, check=None) -> dict:
    pending = list(enumerate(prompts))
    finals, step = {}, 0
    while pending or engine.has_unfinished():
        if pending and step % every == 0:
            i, prompt = pending.pop(0)
            engine.add_request(prompt, params, request_id=f"r{i}")
        for out in engine.step().outputs:
            if out.finished:
                finals[out.request_id] = out
        if check is not None:
            check(engine)
        step += 1
    return finals


def rolled_back(engine: LLMEngine) -> None:
    """After a step no sequence holds a slot past its own tokens, nor a block past its slots; one that
    verified drafts this step holds slots for exactly its computed tokens (the rejected ones' are gone)."""
    alloc = engine.allocator
    alloc.inspect().check_invariants()
    for seq in engine.scheduler.running:
        if alloc.has_sequence(seq.seq_id):
            slots = alloc.num_tokens(seq.seq_id)
            assert slots <= seq.num_tokens
            assert len(alloc.block_table(seq.seq_id)) == blocks_for(slots, alloc.block_size)
            if seq.seq_id in engine.last_accepted:
                assert slots == seq.num_computed == seq.num_tokens - 1


def assert_clean(engine: LLMEngine, num_requests: int) -> None:
    alloc = engine.allocator
    alloc.inspect().check_invariants()
    assert alloc.num_used_blocks == 0 and alloc.num_reserved_blocks == 0
    assert all(alloc.refcount(b) == 0 for b in range(alloc.num_blocks))
    assert engine.slots.in_use == 0
    assert engine.runner.host_swap is None or engine.runner.host_swap.in_use == 0
    assert len(engine.ledger.records) == num_requests
    assert not engine.has_unfinished()


# ------------------------------------------------------------------------------------------ configs


@pytest.mark.parametrize("bad, key", [
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": -2}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2.5}, "num_speculative_tokens"),
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "eagle3", "num_speculative_tokens": 2}, "method"),
    ({"num_speculative_tokens": 2}, "method"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 0}, "prompt_lookup_max"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, "prompt_lookup_min": 3},
     "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "keys"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "model": 3}, "model"),
])
def test_bad_configs_are_refused_naming_the_key(bad, key):
    with pytest.raises(ValueError, match=key):
        EngineConfig(speculative_config=bad)


def test_configs_take_vllm_defaults():
    assert speculative_config({"method": "ngram", "num_speculative_tokens": 3}) == SpeculativeConfig(
        "ngram", 3, prompt_lookup_max=5, prompt_lookup_min=5)
    assert speculative_config({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
                              ).prompt_lookup_min == 4
    assert EngineConfig(speculative_config=NGRAM).speculative_config.prompt_lookup_max == 3


def test_a_draft_with_another_vocabulary_is_refused(model, tokenizer):
    draft = small_llama(1, hidden=32, layers=1, vocab=VOCAB + 8)
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="vocabulary"):
        LLMEngine(model, tokenizer, config(speculative_config=spec))


# ------------------------------------------------------------------------------------------ greedy exactness


@pytest.mark.parametrize("overrides", [
    dict(block_size=4, max_num_batched_tokens=64),
    dict(block_size=4, max_num_batched_tokens=9),  # drafts compete with prefill chunks for the budget
    dict(block_size=16, max_num_batched_tokens=32, enable_prefix_caching=False),
    dict(block_size=2, max_num_batched_tokens=24, max_num_seqs=3, policy="sjf"),
    dict(block_size=4, max_num_batched_tokens=64, reservation_policy="up-front"),
], ids=["roomy", "tight-budget", "no-prefix-cache", "sjf-3-slots", "up-front"])
def test_greedy_is_token_identical_in_mixed_batches(model, tokenizer, overrides):
    prompts = copy_heavy(1, 8)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    engine = LLMEngine(model, tokenizer, config(speculative_config=NGRAM, **overrides))
    finals = run_staggered(engine, prompts, params, check=rolled_back)
    for i, prompt in enumerate(prompts):
        assert list(finals[f"r{i}"].token_ids) == expected_ids(model, prompt, params), f"request r{i}"
    stats = engine.stats().spec_decoding
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # both accepted and rejected drafts
    mixed = [r for r in engine.trace if r.draft_tokens and set(r.prefill_tokens) - set(r.draft_tokens)]
    assert mixed, "some step should verify drafts beside a prefill chunk"
    assert_clean(engine, len(prompts))


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_is_token_identical_under_preemption(model, tokenizer, mode):
    prompts = copy_heavy(2, 6)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    engine = LLMEngine(model, tokenizer, config(block_size=4, num_blocks=24, max_num_batched_tokens=24,
                                                preemption_mode=mode, speculative_config=NGRAM))
    finals = run_staggered(engine, prompts, params, every=1, check=rolled_back)
    for i, prompt in enumerate(prompts):
        assert list(finals[f"r{i}"].token_ids) == expected_ids(model, prompt, params), f"request r{i}"
    assert sum(len(r.preempted) + len(r.swapped_out) for r in engine.trace) > 0
    assert engine.stats().spec_decoding.num_accepted_tokens > 0
    assert_clean(engine, len(prompts))


def test_greedy_is_token_identical_with_prefix_cache_hits(model, tokenizer):
    shared = copy_heavy(3, 2)[1]
    prompts = [shared + [7 + i] for i in range(4)] + [shared]
    params = SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True)
    engine = LLMEngine(model, tokenizer, config(block_size=4, speculative_config=NGRAM))
    finals = run_staggered(engine, prompts, params, every=6, check=rolled_back)
    for i, prompt in enumerate(prompts):
        assert list(finals[f"r{i}"].token_ids) == expected_ids(model, prompt, params), f"request r{i}"
    assert sum(f.usage.cached_prompt_tokens for f in finals.values()) > 0
    assert engine.stats().spec_decoding.num_drafts > 0
    assert_clean(engine, len(prompts))


def test_greedy_with_a_draft_model_is_token_identical(model, tokenizer):
    draft = small_llama(0, hidden=64, layers=2)  # the target's initialisation, perturbed: agrees often
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(0.02 * torch.randn_like(param))
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3}
    prompts = copy_heavy(4, 5)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_num_batched_tokens=32, speculative_config=spec))
    finals = run_staggered(engine, prompts, params, check=rolled_back)
    for i, prompt in enumerate(prompts):
        assert list(finals[f"r{i}"].token_ids) == expected_ids(model, prompt, params), f"request r{i}"
    stats = engine.stats().spec_decoding
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert not engine.proposer.sessions, "every draft KV session is dropped with its sequence"
    assert_clean(engine, len(prompts))


# ------------------------------------------------------------------------------------------ stops, logprobs, n


def test_stops_eos_and_logprobs_stay_exact(model, tokenizer):
    """Several tokens accepted at once still stop at the first stop string, EOS or max_tokens, with the
    same text, ids, finish reason and logprobs as one token per step."""
    prompts = copy_heavy(5, 9)
    text = {}
    for spec in (None, NGRAM):
        engine = LLMEngine(model, tokenizer, config(block_size=4, speculative_config=spec))
        outs = []
        for i, prompt in enumerate(prompts):
            params = SamplingParams(temperature=0.0, max_tokens=5 + 3 * i, logprobs=2,
                                    stop=(tokenizer.decode(prompt[2:4]),) if i % 2 else ())
            engine.add_request(prompt, params)
            logprobs = []
            while engine.has_unfinished():
                for out in engine.step().outputs:
                    logprobs += out.logprobs
            outs.append((out, logprobs))
        text[spec is None] = outs
        assert_clean(engine, len(prompts))
    assert engine.stats().spec_decoding.num_accepted_tokens > 0
    for (plain, plain_lp), (spec, spec_lp) in zip(text[True], text[False]):
        assert (spec.text, spec.token_ids, spec.finish_reason) == (plain.text, plain.token_ids, plain.finish_reason)
        assert [lp.token for lp in spec_lp] == [lp.token for lp in plain_lp]
        np.testing.assert_allclose([lp.logprob for lp in spec_lp], [lp.logprob for lp in plain_lp], atol=1e-4)
    assert {o.finish_reason for o, _ in text[False]} >= {"length", "stop"}


def test_seeded_sampling_with_n_samples_is_reproducible_and_clean(model, tokenizer):
    params = SamplingParams(temperature=0.8, max_tokens=20, n=3, seed=11, ignore_eos=True)
    runs = []
    for _ in range(2):
        engine = LLMEngine(model, tokenizer, config(block_size=4, speculative_config=NGRAM))
        out = engine.generate([copy_heavy(6, 2)[1]], params)[0]
        runs.append([s.token_ids for s in out.samples])
        assert len(out.samples) == 3 and all(len(ids) == 20 for ids in runs[-1])
        assert engine.stats().spec_decoding.num_drafts > 0
        assert_clean(engine, 1)
    assert runs[0] == runs[1]


# ------------------------------------------------------------------------------------------ the sampled distribution


def fake_seq(params: SamplingParams, seed: int) -> types.SimpleNamespace:
    generator = torch.Generator().manual_seed(seed)
    return types.SimpleNamespace(params=params, prompt_ids=[1, 2], output_ids=[3], generator=generator)


@pytest.mark.parametrize("point_mass", [True, False], ids=["ngram", "draft-model"])
def test_verified_tokens_follow_the_target_distribution(point_mass):
    """Chi-square on a vocabulary of 6: the first emitted token is distributed as the target's row 0, and
    the second (once the first draft is accepted) as its row 1, for point-mass drafts (n-gram) and for
    drafts drawn from another distribution q (a draft model)."""
    vocab, trials = 6, 12_000
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, vocab, generator=gen, dtype=torch.float64) * 1.5).float()
    params = SamplingParams(temperature=0.9, top_k=5)
    rows = [SamplingRow(params, [1, 2], [3], torch.Generator()) for _ in range(3)]
    target = next_token_probs(logits, rows)[0].numpy()  # the target's final distributions (no penalties)
    q = [torch.softmax(torch.randn(vocab, generator=gen, dtype=torch.float64), -1) for _ in range(2)]
    ngram_drafts = (int(target[0].argmax()), int(target[1].argsort()[-2]))  # often accepted, often not
    seq = fake_seq(params, 1)
    draws = np.random.default_rng(2)
    first, second = np.zeros(vocab), np.zeros(vocab)
    for _ in range(trials):
        if point_mass:
            drafts, draft_probs = ngram_drafts, None
        else:
            drafts, draft_probs = tuple(int(draws.choice(vocab, p=row.numpy())) for row in q), q
        result = verify(logits, seq, drafts, draft_probs)
        first[result.tokens[0]] += 1
        if result.accepted >= 1:
            second[result.tokens[1]] += 1
    for counts, p in ((first, target[0]), (second, target[1])):
        support = p > 0
        assert counts[~support].sum() == 0 and counts.sum() > 1000
        assert chisquare(counts[support], p[support] / p[support].sum() * counts.sum()).pvalue > 1e-3


def test_greedy_verification_keeps_the_longest_matching_prefix():
    logits = torch.full((4, 8), -5.0)
    for row, token in enumerate([3, 5, 1, 6]):
        logits[row, token] = 5.0
    seq = fake_seq(SamplingParams(temperature=0.0), 0)
    assert verify(logits, seq, (3, 5, 2)).tokens == [3, 5, 1]  # two accepted, one corrected
    assert verify(logits, seq, (3, 5, 1)).tokens == [3, 5, 1, 6]  # all accepted, one bonus
    assert verify(logits, seq, (4, 5, 1)).accepted == 0
    stats = SpecDecodingStats(3)
    stats.observe(3, 2)
    stats.observe(3, 3)
    assert stats.num_accepted_tokens_per_pos == [2, 2, 1] and stats.mean_acceptance_length == 3.5


# ------------------------------------------------------------------------------------------ fuzz


def test_fuzz_of_200_requests_with_rejections_leaves_every_block_free(model, tokenizer):
    rng = random.Random(7)
    engine = LLMEngine(model, tokenizer, config(
        block_size=4, num_blocks=48, max_num_seqs=6, max_num_batched_tokens=24, max_model_len=96,
        preemption_mode="recompute", speculative_config=NGRAM | {"num_speculative_tokens": 3}))
    issued, live = 0, []
    while issued < 200 or engine.has_unfinished():
        for _ in range(rng.choice([0, 1, 1, 2])):
            if issued < 200:
                prompt = copy_heavy(rng.randrange(1000), 2)[rng.randrange(2)][:40]
                params = SamplingParams(temperature=rng.choice([0.0, 0.0, 1.0]), max_tokens=rng.randrange(1, 25),
                                        stop=rng.choice([(), ("e",)]), ignore_eos=rng.random() < 0.5,
                                        n=rng.choice([1, 1, 1, 2]), seed=rng.randrange(100))
                live.append(engine.add_request(prompt, params))
                issued += 1
        if live and rng.random() < 0.05:
            engine.cancel(live.pop(rng.randrange(len(live))))
        engine.step()
        rolled_back(engine)
    stats = engine.stats().spec_decoding
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert sum(len(r.preempted) for r in engine.trace) > 0
    assert_clean(engine, issued)


# ------------------------------------------------------------------------------------------ server


def test_server_flag_and_metrics_use_vllms_names():
    import json

    from servelab.engine.llm_engine import EngineStats
    from servelab.lifecycle.ledger import Ledger
    from servelab.loadgen import parse_metrics
    from servelab.server.__main__ import build_parser, engine_kwargs
    from servelab.server.metrics import ServerMetrics

    args = build_parser().parse_args(["--speculative-config", json.dumps(NGRAM)])
    assert engine_kwargs(args)["speculative_config"] == NGRAM
    for bad in ('{"method": "eagle3", "num_speculative_tokens": 2}', "{not json"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--speculative-config", bad])
    metrics = ServerMetrics("m")
    stats = SpecDecodingStats(3)
    for scrape, rows in enumerate(([(3, 2), (3, 0)], [(3, 3)])):
        for drafted, accepted in rows:
            stats.observe(drafted, accepted)
        metrics.set_engine_stats(EngineStats(0, 0, 0, 0.0, Ledger().totals(), stats))
    scraped = parse_metrics(metrics.render().decode())
    assert scraped.value("servelab:spec_decode_num_drafts_total", model_name="m") == 3
    assert scraped.value("servelab:spec_decode_num_draft_tokens_total") == 9
    assert scraped.value("servelab:spec_decode_num_accepted_tokens_total") == 5
    per_pos = [scraped.value("servelab:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
               for i in range(3)]
    assert per_pos == [2, 2, 1]


def test_a_prompt_with_n_samples_forks_before_it_speculates(model, tokenizer):
    """A chunked prompt whose last chunk is one token looks like a decode: with n > 1 it must fork first
    (no verify row), then every sample speculates on its own."""
    prompt = [5, 9, 13, 2, 7] * 3 + [5, 9]  # 17 tokens: a 16-token chunk, then the last one alone
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_num_batched_tokens=16, speculative_config=NGRAM))
    params = SamplingParams(temperature=0.7, max_tokens=12, n=2, seed=3, ignore_eos=True)
    engine.add_request(prompt, params)
    for _ in range(100):  # a bound: a prompt that never forks would never finish
        finals = [o for o in engine.step().outputs if o.finished]
        if finals:
            break
    out = finals[0]
    assert len(out.samples) == 2 and all(len(s.token_ids) == 12 for s in out.samples)
    assert engine.stats().spec_decoding.num_drafts > 0
    assert_clean(engine, 1)


def test_allocator_truncate_frees_blocks_of_rejected_slots_only():
    from servelab.kv.allocator import BlockAllocator

    alloc = BlockAllocator(num_blocks=8, block_size=4, cache_on_compute=True)
    alloc.allocate_prompt("s", [1, 2, 3, 4, 5, 6])
    alloc.mark_computed("s", 6)
    alloc.append_tokens("s", [7, 8, 9, 10, 11])  # slots 6..10: blocks 2 (8..11) is new
    assert len(alloc.block_table("s")) == 3 and alloc.num_tokens("s") == 11
    with pytest.raises(ValueError, match="tail_ids"):
        alloc.truncate("s", 7, [5, 6])
    with pytest.raises(ValueError, match="num_tokens"):
        alloc.truncate("s", 3, [1, 2, 3])  # below the published first block
    assert alloc.truncate("s", 7, [5, 6, 7]) == 1  # keep 0..6: block 2 held only rejected slots
    assert alloc.num_tokens("s") == 7 and len(alloc.block_table("s")) == 2
    alloc.append_tokens("s", [99])  # the block of slots 4..7 fills with the real next id
    alloc.mark_computed("s", 8)
    assert alloc.lookup_prefix([1, 2, 3, 4, 5, 6, 7, 99, 0]) == 8  # its key is the real ids', not the draft's
    assert alloc.lookup_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0]) == 4
    alloc.free("s")
    alloc.inspect().check_invariants()


def test_bench_side_by_side_compares_outputs_and_counts_steps(model, tokenizer):
    import time

    from servelab.bench.spec_bench import side_by_side

    prompts = copy_heavy(0, 6)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    plain, spec = (LLMEngine(model, tokenizer, config(enable_prefix_caching=True, speculative_config=c))
                   for c in (None, NGRAM))
    result, agree, steps = side_by_side(plain, spec, prompts, params, repeats=3, warmup=1,
                                        clock=time.thread_time)
    assert agree and len(result.a.samples) == len(result.b.samples) == 3
    assert steps["plain"] == 16 and 1 <= steps["speculative"] <= 16  # the steps of one run
    stats = spec.stats().spec_decoding
    assert stats.num_drafts > 0 and stats.num_drafts % 4 == 0  # warm-up + 3 runs, the same drafts each
