"""Speculative decoding: the accept/correct rule is lossless, greedy is exact, the bookkeeping adds up."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.engine.reference import reference_generate
from servelab.model import LlamaConfig, LlamaForCausalLM
from servelab.sampling import SamplingParams
from servelab.optimizations.speculative import (KVSession, acceptance_probability, autoregressive_generate, output_distribution,
                                  residual_distribution, speculative_generate, verify_draft)

torch.set_num_threads(1)

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [3, 17, 5, 42, 9, 11]
TARGET_CFG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
DRAFT_CFG = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)


def random_llama(cfg: LlamaConfig, seed: int, std: float = 0.3) -> LlamaForCausalLM:
    """A Llama with large random weights, so its greedy output varies from token to token."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, std)
    return model


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    return random_llama(TARGET_CFG, 0)


@pytest.fixture(scope="module")
def close_draft(target) -> LlamaForCausalLM:
    """A draft that agrees with the target often but not always: the target plus weight noise."""
    draft = copy.deepcopy(target)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(0.08 * torch.randn_like(param))
    return draft


def random_distribution(rng: np.random.Generator, size: int, zeros: int = 0) -> np.ndarray:
    weights = rng.exponential(size=size)
    weights[rng.choice(size, zeros, replace=False)] = 0.0
    return weights / weights.sum()


# ---------------------------------------------------------------------------------------- the rule


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 12), zeros_p=st.integers(0, 3), zeros_q=st.integers(0, 3))
def test_exact_marginal_equals_target(seed, size, zeros_p, zeros_q):
    rng = np.random.default_rng(seed)
    p = random_distribution(rng, size, min(zeros_p, size - 1))
    q = random_distribution(rng, size, min(zeros_q, size - 1))
    np.testing.assert_allclose(output_distribution(p, q), p, atol=1e-12)


def test_marginal_by_explicit_enumeration_of_branches():
    """Enumerate (draft token, accept or reject, correction) by hand, without output_distribution."""
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.1, 0.6, 0.1, 0.2])
    marginal = np.zeros(4)
    for x, y in itertools.product(range(4), range(4)):
        if q[x] == 0:
            continue
        a = acceptance_probability(p, q, x)
        marginal[y] += q[x] * ((y == x) * a + (1 - a) * residual_distribution(p, q)[y])
    np.testing.assert_allclose(marginal, p, atol=1e-12)
    assert marginal[3] == 0.0  # a token the target forbids is never emitted, although the draft likes it


def test_empirical_marginal_matches_target():
    rng = np.random.default_rng(7)
    p = random_distribution(rng, 6)
    q = random_distribution(rng, 6)
    n = 8_000
    counts = np.zeros(6)
    for _ in range(n):
        drafted = int(rng.choice(6, p=q))
        counts[verify_draft([p, p], [q], [drafted], rng).tokens[0]] += 1
    # 5 standard errors of a binomial proportion, per token
    assert np.all(np.abs(counts / n - p) < 5 * np.sqrt(p * (1 - p) / n) + 1e-9)
    assert np.abs(counts / n - q).max() > 0.05  # and the draft's own distribution is clearly different


def test_residual_and_acceptance_values():
    p, q = np.array([0.6, 0.4, 0.0]), np.array([0.2, 0.5, 0.3])
    assert acceptance_probability(p, q, 0) == 1.0
    assert acceptance_probability(p, q, 1) == pytest.approx(0.8)
    assert acceptance_probability(p, q, 2) == 0.0
    np.testing.assert_allclose(residual_distribution(p, q), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(residual_distribution(p, p), p)  # rejection impossible; total function


def test_verify_all_accepted_gives_bonus_from_last_target_row():
    one_hot = [np.eye(3)[i] for i in (0, 1, 2)]
    verdict = verify_draft(one_hot, one_hot[:2], [0, 1], np.random.default_rng(0))
    assert verdict.accepted == 2 and verdict.bonus and verdict.tokens == (0, 1, 2)


def test_verify_stops_at_first_rejection():
    p_rows = [np.eye(3)[0], np.eye(3)[2], np.eye(3)[1]]
    q_rows = [np.eye(3)[1], np.eye(3)[2]]
    verdict = verify_draft(p_rows, q_rows, [1, 2], np.random.default_rng(0))
    assert verdict.accepted == 0 and not verdict.bonus and verdict.tokens == (0,)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: output_distribution([0.5, 0.6], [0.5, 0.5]), "p must sum to 1"),
    (lambda: output_distribution([0.5, 0.5], [0.9, 0.0]), "q must sum to 1"),
    (lambda: output_distribution([0.5, 0.5], [0.2, 0.3, 0.5]), "q has 3 entries but p has 2"),
    (lambda: acceptance_probability([0.5, 0.5], [1.0, 0.0], 1), "q\\[token\\] = 0"),
    (lambda: acceptance_probability([0.5, 0.5], [0.5, 0.5], 2), "token must be"),
    (lambda: verify_draft([], [], [], np.random.default_rng(0)), "k >= 1"),
    (lambda: verify_draft([[1.0]], [[1.0]], [0], np.random.default_rng(0)), "k \\+ 1 = 2 target_probs"),
])
def test_rule_rejects_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------- the decoder


def test_greedy_speculative_equals_target_greedy(target, close_draft):
    expected = reference_generate(target, PROMPT, 48)  # the engine's full-recompute loop
    assert len(set(expected)) > 5  # a varied sequence, not one repeated token
    for k in (1, 3, 5):
        result = speculative_generate(target, close_draft, PROMPT, k, GREEDY, np.random.default_rng(k), 48)
        assert result.tokens == expected
    assert 0.0 < result.acceptance_rate < 1.0  # both branches (accept and correct) were exercised
    assert autoregressive_generate(target, PROMPT, GREEDY, np.random.default_rng(0), 48) == expected


def test_greedy_exact_with_unrelated_draft(target):
    unrelated = random_llama(DRAFT_CFG, 5)
    result = speculative_generate(target, unrelated, PROMPT, 4, GREEDY, np.random.default_rng(0), 32)
    assert result.tokens == reference_generate(target, PROMPT, 32)


def test_draft_equal_to_target_accepts_everything(target):
    result = speculative_generate(target, target, PROMPT, 4, SamplingParams(temperature=1.0),
                                  np.random.default_rng(3), 40)
    assert result.acceptance_rate == 1.0
    assert result.tokens_per_cycle == 5.0  # k accepted + 1 bonus per verify pass


def test_eos_stops_generation(target, close_draft):
    greedy = reference_generate(target, PROMPT, 48)
    eos = greedy[20]
    result = speculative_generate(target, close_draft, PROMPT, 4, GREEDY, np.random.default_rng(0), 48,
                                  eos_token_id=eos)
    assert result.tokens == greedy[: greedy.index(eos) + 1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bookkeeping_invariants(target, close_draft, temperature):
    params = SamplingParams(temperature=temperature, top_k=20 if temperature else None)
    result = speculative_generate(target, close_draft, PROMPT, 4, params, np.random.default_rng(11), 45)
    assert len(result.tokens) == 45 == sum(c.emitted for c in result.cycles)
    for c in result.cycles:
        assert c.accepted <= c.verified <= 4
        assert 1 <= c.emitted <= c.verified + 1  # accepted drafts plus at most one target token
        assert c.target_kv_rolled_back == c.verified + 1 - c.emitted  # exactly the rejected drafts' entries
        assert 0 <= c.draft_kv_rolled_back <= c.draft_kv_written
    # committed K/V is the whole sequence except its newest token; rolled-back entries are not in it
    committed = sum(c.target_kv_committed for c in result.cycles)
    assert committed == len(PROMPT) + len(result.tokens) - 1
    written = sum(c.target_kv_written for c in result.cycles)
    assert written - committed == sum(c.target_kv_rolled_back for c in result.cycles)
    if temperature:
        assert sum(c.target_kv_rolled_back for c in result.cycles) > 0


def test_rolled_back_kv_is_never_attended(target, close_draft):
    """After speculation, the committed cache equals a clean prefill of the accepted sequence."""
    result = speculative_generate(target, close_draft, PROMPT, 4, GREEDY, np.random.default_rng(0), 30)
    sequence = PROMPT + result.tokens
    spec = KVSession(target, 64)
    spec.extend(sequence[:10] + [0, 1, 2, 3], 1)  # write four junk tokens after position 9 ...
    spec.rollback(10)  # ... and roll them back
    logits = spec.extend(sequence[10:], len(sequence) - 10)
    clean = KVSession(target, 64)
    expected = clean.extend(sequence, len(sequence) - 10)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(spec.cached_keys(1), clean.cached_keys(1), atol=1e-5, rtol=1e-5)


def test_sampled_first_token_follows_target_distribution(target, close_draft):
    """The first emitted token of many seeded runs is distributed as the target's next-token p."""
    from servelab.sampling import next_token_distribution

    params = SamplingParams(temperature=1.0)
    with torch.no_grad():
        p = next_token_distribution(target(torch.tensor([PROMPT]))[0, -1].numpy(), params)
    rng = np.random.default_rng(5)
    n = 500
    counts = np.zeros(TARGET_CFG.vocab_size)
    rejected = 0
    for _ in range(n):  # two new tokens, so the first one goes through one accept/correct step
        result = speculative_generate(target, close_draft, PROMPT, 1, params, rng, 2)
        counts[result.tokens[0]] += 1
        rejected += result.cycles[0].accepted == 0
    assert rejected > 0
    top = np.argsort(p)[-3:]
    assert np.all(np.abs(counts[top] / n - p[top]) < 5 * np.sqrt(p[top] * (1 - p[top]) / n))


def test_decoder_rejects_bad_inputs(target):
    other_vocab = random_llama(LlamaConfig(vocab_size=80, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1), 0)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="k \\(the draft length\\)"):
        speculative_generate(target, target, PROMPT, 0, GREEDY, rng, 8)
    with pytest.raises(ValueError, match="draft vocabulary"):
        speculative_generate(target, other_vocab, PROMPT, 2, GREEDY, rng, 8)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate(target, target, PROMPT, 2, GREEDY, rng, 0)
    with pytest.raises(ValueError, match="prompt_ids"):
        speculative_generate(target, target, [], 2, GREEDY, rng, 8)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        speculative_generate(target, target, PROMPT, 2, GREEDY, rng, 251)
    with pytest.raises(ValueError, match="length must be in"):
        KVSession(target, 16).rollback(3)


# ------------------------------------------------------------------------------------ the figures


def test_chapter_figures_draw_library_values(target, close_draft):
    from servelab.viz import combining as vc

    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.6, 0.2])
    fig = vc.marginal_figure(p, q, output_distribution(p, q), ["a", "b", "c"], empirical=p)
    assert [t.name for t in fig.data][-1] == "accept/correct, simulated"
    np.testing.assert_allclose(fig.data[2].y, fig.data[0].y)  # exact marginal bars equal the target bars
    with pytest.raises(ValueError, match="one entry per token"):
        vc.marginal_figure(p, q, p, ["a", "b"])

    cost = vc.speculative_cost_figure(acceptance_rate=0.0, draft_ms_per_token=4.0, verify_ms=24.0,
                                      baseline_ms=20.0, max_k=3)
    np.testing.assert_allclose(cost.data[0].y, [28.0, 32.0, 36.0])  # nothing accepted: one token per cycle
    assert "slower" in cost.layout.title.text

    result = speculative_generate(target, close_draft, PROMPT, 3, SamplingParams(temperature=1.0),
                                  np.random.default_rng(4), 30)
    book = vc.bookkeeping_figure(result.cycles)
    emitted = np.add(book.data[0].y, book.data[1].y)
    assert list(emitted) == [c.emitted for c in result.cycles]
    assert list(book.data[2].y) == [c.target_kv_rolled_back for c in result.cycles]

    combo = vc.combination_figure({"base": 10.0, "a": 5.0, "b": 8.0, "ab": 6.0}, "base", ["a", "b"], "ab")
    np.testing.assert_allclose(combo.data[0].y, [2.0, 1.25, 10 / 6, 2.5])


def test_troubleshooting_table_is_complete():
    from servelab.viz import combining as vc

    rows = vc.TROUBLESHOOTING
    assert len(rows) >= 10 and len({r.symptom for r in rows}) == len(rows)
    assert all(r.symptom and r.where and r.measure and r.section.startswith("§") for r in rows)
    assert any("speculative" in r.symptom for r in rows) and any("quantiz" in r.symptom for r in rows)
    rendered = vc.troubleshooting_table()._repr_html_()
    assert rendered.count("<tr>") == len(rows) + 1


def test_prompt_ids_outside_the_vocabulary_are_rejected(target):
    with pytest.raises(ValueError, match="prompt_ids must be int ids in \\[0, 63\\]"):
        speculative_generate(target, target, [1, 64], 2, GREEDY, np.random.default_rng(0), 4)
    with pytest.raises(TypeError, match="draft must be a LlamaForCausalLM"):
        speculative_generate(target, "draft", PROMPT, 2, GREEDY, np.random.default_rng(0), 4)


def test_full_context_is_usable(target, close_draft):
    """The last verify pass shrinks k, so prompt + max_new_tokens may fill the whole context."""
    limit = TARGET_CFG.max_position_embeddings
    result = speculative_generate(target, close_draft, PROMPT, 4, GREEDY, np.random.default_rng(0),
                                  limit - len(PROMPT))
    assert len(result.tokens) == limit - len(PROMPT)


def test_without_kv_reuse_the_output_is_the_same(target, close_draft):
    """reuse_cache=False recomputes every position each pass: same tokens, same bookkeeping."""
    cached = speculative_generate(target, close_draft, PROMPT, 3, GREEDY, np.random.default_rng(0), 24)
    recomputed = speculative_generate(target, close_draft, PROMPT, 3, GREEDY, np.random.default_rng(0), 24,
                                      reuse_cache=False)
    assert recomputed.tokens == cached.tokens == reference_generate(target, PROMPT, 24)
    assert recomputed.cycles == cached.cycles
    plain = autoregressive_generate(target, PROMPT, GREEDY, np.random.default_rng(0), 24, reuse_cache=False)
    assert plain == cached.tokens


def test_shipped_pair_greedy_equals_target_greedy():
    from servelab.model import default_model_dir, draft_model_dir, load_checkpoint, load_tokenizer

    if not all((d / "model.safetensors").is_file() for d in (default_model_dir(), draft_model_dir())):
        pytest.skip("the shipped target/draft checkpoints are not in servelab/assets")
    target = load_checkpoint(device="cpu", dtype=torch.float32)
    draft = load_checkpoint(draft_model_dir(), device="cpu", dtype=torch.float32)
    prompt = load_tokenizer().encode("JULIET:\nO Romeo, Romeo! wherefore art thou").ids
    result = speculative_generate(target, draft, prompt, 4, GREEDY, np.random.default_rng(0), 40)
    assert result.tokens == reference_generate(target, prompt, 40)
    assert result.tokens_per_cycle > 1.0  # the draft agrees with the target at least sometimes


def test_acceptance_rate_counts_examined_drafts_only():
    from servelab.optimizations.speculative import CycleRecord, SpeculativeResult

    cycles = [CycleRecord(4, 1, 2, 5, 3, 4, 2), CycleRecord(4, 4, 5, 5, 0, 4, 0)]
    result = SpeculativeResult(tokens=list(range(7)), cycles=cycles)
    # 5 accepted; examined: 2 in the first cycle (accept, reject), 4 in the second
    assert result.acceptance_rate == pytest.approx(5 / 6)
    assert result.tokens_per_cycle == 3.5


# --------------------------------------------------------------------------------------------------
# Prompt-lookup (n-gram) drafting: same rule, one-hot q
# --------------------------------------------------------------------------------------------------

REPEATING = [3, 17, 5, 42, 9, 11, 3, 17, 5, 42, 9, 11, 3, 17]


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    from servelab.optimizations.speculative import PromptLookupProposer

    proposer = PromptLookupProposer(max_ngram=3)
    assert proposer.propose([1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3], 2) == [5, 1]  # latest occurrence of (1, 2, 3)
    assert proposer.propose([1, 2, 9, 7, 2], 3) == [9, 7, 2]  # falls back to the 1-gram (2,)
    assert proposer.propose([1, 2, 3], 4) == []  # no earlier occurrence: nothing to draft
    assert proposer.propose([4, 4], 3) == [4]  # never proposes past the end of the sequence
    with pytest.raises(ValueError, match="max_ngram must be an int >= 2"):
        PromptLookupProposer(max_ngram=1, min_ngram=2)


def test_one_hot_draft_keeps_the_marginal_exact():
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = rng.dirichlet(np.ones(6))
        for x in range(6):
            q = np.eye(6)[x]
            np.testing.assert_allclose(output_distribution(p, q), p, atol=1e-12)


def test_prompt_lookup_greedy_equals_target_greedy(target):
    from servelab.optimizations.speculative import PromptLookupProposer

    for prompt in (PROMPT, REPEATING):
        expected = reference_generate(target, prompt, 40)
        for k in (1, 4):
            result = speculative_generate(target, PromptLookupProposer(), prompt, k, GREEDY,
                                          np.random.default_rng(0), 40)
            assert result.tokens == expected
            assert all(c.draft_kv_written == 0 and c.emitted <= c.verified + 1 for c in result.cycles)
    assert sum(c.verified for c in result.cycles) > 0  # drafts were proposed and verified


def test_prompt_lookup_sampled_first_token_follows_target_distribution(target):
    from servelab.sampling import next_token_distribution
    from servelab.optimizations.speculative import PromptLookupProposer

    params = SamplingParams(temperature=1.0)
    with torch.no_grad():
        p = next_token_distribution(target(torch.tensor([REPEATING]))[0, -1].numpy(), params)
    rng = np.random.default_rng(7)
    n = 500
    counts = np.zeros(TARGET_CFG.vocab_size)
    rejected = 0
    for _ in range(n):  # the proposer always drafts 5 (it follows 3, 17 earlier), so one accept/correct step
        result = speculative_generate(target, PromptLookupProposer(), REPEATING, 1, params, rng, 2)
        assert result.cycles[0].verified == 1
        counts[result.tokens[0]] += 1
        rejected += result.cycles[0].accepted == 0
    assert rejected > 0 and counts[5] < n  # both branches ran
    top = np.argsort(p)[-3:]
    assert np.all(np.abs(counts[top] / n - p[top]) < 5 * np.sqrt(p[top] * (1 - p[top]) / n))


def test_prompt_lookup_on_a_repeating_prompt_beats_one_token_per_forward():
    from servelab.model import default_model_dir, load_checkpoint, load_tokenizer
    from servelab.optimizations.speculative import PromptLookupProposer

    if not (default_model_dir() / "model.safetensors").is_file():
        pytest.skip("the shipped checkpoint is not in servelab/assets")
    target = load_checkpoint(device="cpu", dtype=torch.float32)
    line = "KING HENRY V:\nI will not be a man, and I will not.\n\n"
    prompt = load_tokenizer().encode(line * 2).ids
    result = speculative_generate(target, PromptLookupProposer(), prompt, 4, GREEDY, np.random.default_rng(0), 48)
    assert result.tokens == reference_generate(target, prompt, 48)
    assert result.tokens_per_cycle > 1.5  # more than one token per target forward, and exact
