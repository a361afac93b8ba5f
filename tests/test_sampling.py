"""Tests for servelab.sampling: the seed's worked examples, properties, and argument checks."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.sampling import (
    FILTER_NAMES,
    SamplingParams,
    apply_frequency_presence,
    apply_hard_constraints,
    apply_hard_mask,
    apply_logit_bias,
    apply_penalties,
    apply_repetition_penalty,
    apply_temperature,
    apply_truncation_filters,
    ban_sequences,
    beam_search,
    best_of_n_kv_tokens,
    force_token,
    greedy,
    min_p_filter,
    min_p_support_from_logits,
    next_token_distribution,
    no_repeat_ngram_mask,
    sample,
    sample_next_token,
    softmax,
    support,
    temperature_probs,
    token_counts,
    top_k_filter,
    top_p_filter,
    typical_filter,
)

CAT_DOG_BIRD_CAR = [4.0, 3.0, 2.0, 1.0]


def independent_softmax(z):
    """Plain-Python softmax used as an independent reference."""
    finite = [x for x in z if x != -math.inf]
    top = max(finite)
    weights = [0.0 if x == -math.inf else math.exp(x - top) for x in z]
    total = math.fsum(weights)
    return [w / total for w in weights]


# -------------------------------------------------------------------------------------------------
# Seed worked examples
# -------------------------------------------------------------------------------------------------


def test_softmax_cat_dog_bird_car_at_t1():
    p = softmax(CAT_DOG_BIRD_CAR)
    assert p[0] == pytest.approx(0.643914, abs=1e-6)
    assert p == pytest.approx(independent_softmax(CAT_DOG_BIRD_CAR), rel=1e-12)
    assert p.dtype == np.float64


def test_top_k_2_renormalises_cat():
    q = top_k_filter(softmax(CAT_DOG_BIRD_CAR), k=2)
    assert q[0] == pytest.approx(0.731059, abs=1e-6)
    assert q[1] == pytest.approx(0.268941, abs=1e-6)
    assert list(q[2:]) == [0.0, 0.0]


def test_all_three_controls_worked_example():
    params = SamplingParams(temperature=2.0, top_k=3, top_p=0.8)
    q = next_token_distribution(CAT_DOG_BIRD_CAR, params)
    assert q == pytest.approx([0.622459, 0.377541, 0.0, 0.0], abs=1e-6)
    assert q[2] == 0.0 and q[3] == 0.0


def test_low_temperature_is_still_sampling():
    p = temperature_probs(CAT_DOG_BIRD_CAR, 0.1)
    assert p[0] == pytest.approx(0.99995, abs=1e-5)
    assert p[0] < 1.0 and (p > 0).all()


def test_tied_maximum_splits_mass_but_greedy_picks_lowest_id():
    tied = [4.0, 4.0, 2.0, 1.0]
    p = temperature_probs(tied, 1e-3)
    assert p[:2] == pytest.approx([0.5, 0.5], abs=1e-12)
    assert p[2:].sum() < 1e-12
    assert greedy(tied) == 0
    assert greedy([1.0, 7.0, 7.0]) == 1


def test_top_p_keeps_boundary_token():
    probs = [0.4, 0.3, 0.2, 0.1]
    assert support(top_p_filter(probs, 0.65)) == [0, 1]
    # "cumulative strictly below p" would keep only token 0: the boundary token must stay.
    assert probs[0] < 0.65


def test_filter_order_example_top_k_then_top_p_vs_reverse():
    probs = [0.60, 0.25, 0.10, 0.05]
    k_first = top_p_filter(top_k_filter(probs, 2), 0.7)
    p_first = top_k_filter(top_p_filter(probs, 0.7), 2)
    assert list(k_first) == [1.0, 0.0, 0.0, 0.0]
    assert p_first == pytest.approx([0.7059, 0.2941, 0.0, 0.0], abs=1e-4)


def test_d02_filters_do_not_commute():
    probs = [0.45, 0.30, 0.15, 0.10]
    assert support(top_p_filter(top_k_filter(probs, 3), 0.8)) == [0, 1]
    assert support(top_k_filter(top_p_filter(probs, 0.8), 3)) == [0, 1, 2]


def test_d02_through_params_filter_order():
    logits = np.log([0.45, 0.30, 0.15, 0.10])
    k_first = SamplingParams(top_k=3, top_p=0.8, filter_order=("top_k", "top_p"))
    p_first = SamplingParams(top_k=3, top_p=0.8, filter_order=("top_p", "top_k"))
    assert support(next_token_distribution(logits, k_first)) == [0, 1]
    assert support(next_token_distribution(logits, p_first)) == [0, 1, 2]


def test_typical_excludes_the_most_probable_token():
    q = typical_filter([0.02, 0.35, 0.33, 0.30], 0.63)
    assert support(q) == [2, 3]
    assert q[2:] == pytest.approx([0.33 / 0.63, 0.30 / 0.63])


def test_min_p_support_grows_with_temperature():
    sizes = [len(min_p_support_from_logits(CAT_DOG_BIRD_CAR, t, alpha=0.3))
             for t in (0.2, 0.5, 1.0, 2.0, 5.0)]
    assert sizes == sorted(sizes)
    assert sizes[0] < sizes[-1]
    assert sizes == [1, 1, 2, 3, 4]  # gaps allowed below z_max=4: T*|ln 0.3| = 0.24, 0.60, 1.20, 2.41, 6.02


def test_repetition_penalty_is_sign_aware():
    z = apply_repetition_penalty([-2.0, 3.0, 0.0, 5.0], seen_ids=[0, 1, 2], penalty=1.2)
    assert z[0] == pytest.approx(-2.4)  # multiplied, not -2 / 1.2 = -1.667 (a reward)
    assert z[1] == pytest.approx(2.5)
    assert z[2] == 0.0
    assert z[3] == 5.0  # unseen: untouched
    assert -2.0 / 1.2 > -2.0  # the naive rule would raise the negative logit


# -------------------------------------------------------------------------------------------------
# Individual functions
# -------------------------------------------------------------------------------------------------


def test_softmax_masked_tokens_get_exact_zero_and_no_overflow():
    p = softmax([1000.0, -np.inf, 999.0])
    assert p[1] == 0.0
    assert p[0] == pytest.approx(1 / (1 + math.exp(-1)))


def test_apply_temperature_divides_and_keeps_mask():
    z = apply_temperature([2.0, -np.inf, -1.0], 0.5)
    assert list(z) == [4.0, -np.inf, -2.0]


def test_top_k_tie_at_boundary_keeps_smaller_id():
    assert support(top_k_filter([0.3, 0.2, 0.3, 0.2], 1)) == [0]
    assert support(top_k_filter([0.2, 0.3, 0.2, 0.3], 3)) == [0, 1, 3]


def test_top_k_larger_than_support_is_a_no_op():
    probs = [0.5, 0.0, 0.5]
    assert list(top_k_filter(probs, 10)) == [0.5, 0.0, 0.5]


def test_top_p_one_keeps_whole_support_even_tiny_tail():
    probs = np.array([1 - 1e-12, 1e-12])
    assert support(top_p_filter(probs, 1.0)) == [0, 1]


def test_top_p_tolerance_handles_float_sums():
    # In binary floating point 0.35 + 0.33 = 0.6799999999999999 < 0.68, so an exact comparison
    # would wrongly pull the third token in; MASS_TOLERANCE keeps the intended two.
    assert 0.35 + 0.33 < 0.68
    assert support(top_p_filter([0.35, 0.33, 0.32], 0.68)) == [0, 1]


def test_min_p_filter_relative_to_max():
    q = min_p_filter([0.5, 0.2, 0.15, 0.1, 0.05], 0.3)
    assert support(q) == [0, 1, 2]  # threshold 0.15 is kept (>=)
    assert support(min_p_filter([0.5, 0.5], 1.0)) == [0, 1]
    assert support(min_p_filter([0.7, 0.2, 0.1], 0.0)) == [0, 1, 2]


def test_min_p_logit_form_agrees_with_probability_form():
    rng = np.random.default_rng(7)
    for _ in range(50):
        z = rng.normal(scale=3.0, size=12)
        t = float(rng.uniform(0.2, 3.0))
        a = float(rng.uniform(0.05, 0.95))
        assert min_p_support_from_logits(z, t, a) == support(min_p_filter(temperature_probs(z, t), a))


def test_penalties_frequency_and_presence():
    counts = token_counts([1, 1, 1, 3], vocab_size=4)
    assert list(counts) == [0, 3, 0, 1]
    z = apply_frequency_presence([1.0, 1.0, 1.0, 1.0], counts, frequency=0.5, presence=0.25)
    assert z == pytest.approx([1.0, 1.0 - 1.5 - 0.25, 1.0, 1.0 - 0.5 - 0.25])


def test_logit_bias_adds_offsets():
    z = apply_logit_bias([0.0, 1.0, -np.inf], {1: 2.0, 0: -1.0, 2: 5.0})
    assert list(z) == [-1.0, 3.0, -np.inf]
    assert list(apply_logit_bias([0.0, 0.0], [(1, 0.5)])) == [0.0, 0.5]


def test_hard_mask_and_force_token():
    z = apply_hard_mask([1.0, 2.0, 3.0, 4.0], [0, 2])
    assert list(z) == [1.0, -np.inf, 3.0, -np.inf]
    forced = force_token([5.0, 1.0, 2.0], 1)
    assert support(softmax(forced)) == [1]


def test_ban_sequences_only_masks_completion():
    logits = [0.0] * 5
    banned = [(1, 2, 3), (4,)]
    assert not np.isfinite(ban_sequences(logits, [0, 1, 2], banned)[3])
    assert np.isfinite(ban_sequences(logits, [0, 1, 0], banned)[3])  # prefix absent: 3 is fine
    for history in ([], [1, 2], [3, 3]):
        assert ban_sequences(logits, history, banned)[4] == -np.inf  # unigram banned everywhere
    assert np.isfinite(ban_sequences(logits, [2], banned)).sum() == 4


def test_no_repeat_ngram_mask():
    logits = [0.0] * 6
    history = [1, 2, 3, 1, 2]
    z = no_repeat_ngram_mask(logits, history, 3)  # context (1, 2) was followed by 3
    assert [i for i in range(6) if z[i] == -np.inf] == [3]
    z2 = no_repeat_ngram_mask(logits, history, 2)  # context (2,) was followed by 3
    assert [i for i in range(6) if z2[i] == -np.inf] == [3]
    z1 = no_repeat_ngram_mask(logits, history, 1)
    assert [i for i in range(6) if z1[i] == -np.inf] == [1, 2, 3]
    assert np.isfinite(no_repeat_ngram_mask(logits, [1], 3)).all()


def brute_no_repeat(history, n, vocab):
    """Reference: token t is banned if history + [t] ends with an n-gram already in history."""
    banned = set()
    for t in range(vocab):
        seq = list(history) + [t]
        if len(seq) < n:
            continue
        last = tuple(seq[-n:])
        earlier = {tuple(history[i:i + n]) for i in range(len(history) - n + 1)}
        if last in earlier:
            banned.add(t)
    return banned


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=12), st.integers(1, 4))
def test_no_repeat_ngram_matches_brute_force(history, n):
    z = no_repeat_ngram_mask([0.0] * 4, history, n)
    assert {i for i in range(4) if z[i] == -np.inf} == brute_no_repeat(history, n, 4)


def test_sample_one_survivor_still_consumes_one_draw():
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    assert sample([0.0, 1.0, 0.0], a) == 1
    b.random()
    assert a.random() == b.random()


def test_sample_is_inverse_cdf_of_one_uniform():
    probs = np.array([0.1, 0.0, 0.6, 0.3])
    rng, mirror = np.random.default_rng(11), np.random.default_rng(11)
    for _ in range(200):
        u = mirror.random()
        expected = 0 if u < 0.1 else (2 if u < 0.7 else 3)
        assert sample(probs, rng) == expected


def test_sample_empirical_frequencies_match():
    probs = softmax(CAT_DOG_BIRD_CAR)
    rng = np.random.default_rng(2024)
    draws = 20_000
    counts = np.bincount([sample(probs, rng) for _ in range(draws)], minlength=4)
    expected = probs * draws
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 16.27  # 99.9% quantile of chi-square with 3 degrees of freedom


def test_greedy_params_return_one_hot_after_constraints_and_penalties():
    params = SamplingParams(temperature=0.0, repetition_penalty=3.0, top_p=0.1)
    q = next_token_distribution([3.0, 2.0, 1.0], params, prompt_ids=[0])
    assert list(q) == [0.0, 1.0, 0.0]  # 3/3 = 1 < 2: the penalty moves the argmax before the branch
    masked = SamplingParams(temperature=0.0, allowed_token_ids=(2,))
    assert list(next_token_distribution([3.0, 2.0, 1.0], masked)) == [0.0, 0.0, 1.0]
    assert sample_next_token([1.0, 5.0, 5.0], SamplingParams(temperature=0), np.random.default_rng(0)) == 1


def test_penalty_scope_frequency_output_only_repetition_prompt_and_output():
    freq = SamplingParams(frequency_penalty=1.0)
    z = apply_penalties([0.0, 0.0, 0.0], freq, prompt_ids=[0, 0], output_ids=[1])
    assert list(z) == [0.0, -1.0, 0.0]
    rep = SamplingParams(repetition_penalty=2.0)
    z = apply_penalties([2.0, 2.0, 2.0], rep, prompt_ids=[0], output_ids=[1])
    assert list(z) == [1.0, 1.0, 2.0]


def test_hard_constraints_stage_order_and_conflict():
    params = SamplingParams(allowed_token_ids=(0, 1, 2), banned_sequences=((1, 2),),
                            logit_bias={0: 1.5, 3: 9.0})
    z = apply_hard_constraints([0.0, 0.0, 0.0, 0.0], params, output_ids=[1])
    assert list(z) == [1.5, 0.0, -np.inf, -np.inf]  # bias cannot revive the masked token 3
    conflict = SamplingParams(allowed_token_ids=(1,), banned_sequences=((1,),))
    with pytest.raises(ValueError, match="hard constraints"):
        next_token_distribution([0.0, 0.0], conflict)


def test_truncation_stage_skips_disabled_filters():
    probs = softmax(CAT_DOG_BIRD_CAR)
    assert np.array_equal(apply_truncation_filters(probs, SamplingParams()), probs)
    assert SamplingParams(top_p=0.9, min_p=0.1).enabled_filters() == ("top_p", "min_p")


def test_next_token_distribution_composes_the_stages():
    rng = np.random.default_rng(5)
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.3,
                            presence_penalty=0.4, no_repeat_ngram_size=2)
    prompt, output = [1, 2, 3], [4, 5, 4]
    z = rng.normal(size=10)
    manual = apply_hard_constraints(z, params, output)
    manual = apply_penalties(manual, params, prompt, output)
    manual = top_p_filter(top_k_filter(temperature_probs(manual, 0.7), 5), 0.9)
    manual = min_p_filter(manual, 0.05)
    assert np.allclose(next_token_distribution(z, params, prompt, output), manual, atol=0, rtol=1e-12)
    assert next_token_distribution(z, params, prompt, output)[5] == 0.0  # (4, 5) seen: 5 banned after 4


def test_sample_next_token_is_reproducible_with_a_seeded_generator():
    params = SamplingParams(temperature=1.3, top_p=0.95)
    z = np.linspace(-2, 2, 9)
    first = [sample_next_token(z, params, rng) for rng in [np.random.default_rng(42)] for _ in range(30)]
    rng = np.random.default_rng(42)
    again = [sample_next_token(z, params, rng) for _ in range(30)]
    assert first == again


def test_sampling_params_normalisation_and_hashability():
    params = SamplingParams(logit_bias={7: -1, 2: 0.5}, banned_sequences=[[1, 2], [3]], stop="END",
                            allowed_token_ids=[4, 5], filter_order=["min_p", "top_k"], top_k=3)
    assert params.logit_bias == ((2, 0.5), (7, -1.0))
    assert params.banned_sequences == ((1, 2), (3,))
    assert params.stop == ("END",)
    assert params.allowed_token_ids == (4, 5)
    assert params.filter_order == ("min_p", "top_k")
    assert hash(params) == hash(SamplingParams(logit_bias=[(2, 0.5), (7, -1.0)], banned_sequences=((1, 2), (3,)),
                                               stop=("END",), allowed_token_ids=(4, 5),
                                               filter_order=("min_p", "top_k"), top_k=3))
    with pytest.raises(AttributeError):
        params.temperature = 0.5  # frozen


def test_beam_search_prunes_and_can_miss_global_optimum():
    # Step 1: token 0 (0.6) vs token 1 (0.4). After 0 the next step is spread thin; after 1 it is sure.
    first = np.log([0.6, 0.4, 1e-12])
    after_0 = np.log([0.34, 0.33, 0.33])
    after_1 = np.log([0.01, 0.01, 0.98])

    def step(sequences):
        rows = []
        for seq in sequences:
            generated = seq[1:]
            rows.append(first if not generated else (after_0 if generated[0] == 0 else after_1))
        return np.array(rows)

    narrow = beam_search(step, [0], beam_width=1, max_new_tokens=2, length_alpha=0.0)
    wide = beam_search(step, [0], beam_width=3, max_new_tokens=2, length_alpha=0.0)
    assert narrow[0].token_ids == (0, 0)
    assert narrow[0].log_prob == pytest.approx(math.log(0.6 * 0.34))
    assert wide[0].token_ids == (1, 2)
    assert wide[0].log_prob == pytest.approx(math.log(0.4 * 0.98))
    # Exhaustive search agrees with the wide beam here: the width covers every 2-token path's prefix.
    best = max(itertools.product(range(3), repeat=2),
               key=lambda y: first[y[0]] + (after_0 if y[0] == 0 else after_1)[y[1]])
    assert wide[0].token_ids == best


def test_beam_search_eos_and_length_normalisation():
    eos = 0

    def step(sequences):
        rows = []
        for seq in sequences:
            if len(seq) == 1:
                rows.append(np.log([0.5, 0.5, 1e-12]))  # stop now or continue
            else:
                rows.append(np.log([0.3, 1e-12, 0.7]))
        return np.array(rows)

    raw = beam_search(step, [2], beam_width=2, max_new_tokens=3, eos_id=eos, length_alpha=0.0)
    assert raw[0].token_ids == (0,) and raw[0].ended_with_eos
    assert raw[0].score == pytest.approx(math.log(0.5))
    normalised = beam_search(step, [2], beam_width=2, max_new_tokens=3, eos_id=eos, length_alpha=1.0)
    top = normalised[0]
    assert top.score == pytest.approx(top.log_prob / len(top.token_ids))
    assert len(top.token_ids) > 1  # dividing by length favours the longer hypothesis
    assert [h.score for h in normalised] == sorted((h.score for h in normalised), reverse=True)


def test_best_of_n_kv_tokens_shared_vs_copied():
    assert best_of_n_kv_tokens(1000, 200, 4) == 1000 + 4 * 200
    assert best_of_n_kv_tokens(1000, 200, 4, shared_prefix=False) == 4 * 1200
    assert best_of_n_kv_tokens(1000, 200, 1) == best_of_n_kv_tokens(1000, 200, 1, shared_prefix=False)


# -------------------------------------------------------------------------------------------------
# Properties
# -------------------------------------------------------------------------------------------------

finite_logit = st.floats(-20.0, 20.0, allow_nan=False, allow_infinity=False)
logit_vectors = st.lists(st.one_of(finite_logit, st.just(-math.inf)), min_size=1, max_size=12).filter(
    lambda z: any(x != -math.inf for x in z)
)


def prob_vectors():
    return logit_vectors.map(lambda z: softmax(z))


@settings(max_examples=150, deadline=None)
@given(logit_vectors, st.floats(0.05, 10.0))
def test_probabilities_sum_to_one_and_masks_stay_masked(z, t):
    p = temperature_probs(z, t)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    assert all(p[i] == 0.0 for i, x in enumerate(z) if x == -math.inf)
    params = SamplingParams(temperature=t, top_k=3, top_p=0.9, min_p=0.05, typical_p=0.95)
    q = next_token_distribution(z, params)
    assert q.sum() == pytest.approx(1.0, abs=1e-12)
    assert all(q[i] == 0.0 for i, x in enumerate(z) if x == -math.inf)


@settings(max_examples=150, deadline=None)
@given(prob_vectors(), st.integers(1, 15))
def test_top_k_keeps_exactly_min_k_eligible(p, k):
    eligible = int((p > 0).sum())
    q = top_k_filter(p, k)
    assert len(support(q)) == min(k, eligible)
    kept, dropped = q > 0, (p > 0) & (q == 0)
    if dropped.any():
        assert p[kept].min() >= p[dropped].max()


@settings(max_examples=150, deadline=None)
@given(prob_vectors(), st.floats(0.01, 1.0))
def test_top_p_keeps_the_minimal_reaching_prefix(p, threshold):
    kept = support(top_p_filter(p, threshold))
    order = sorted(np.flatnonzero(p > 0), key=lambda i: (-p[i], i))
    assert kept == sorted(order[: len(kept)])
    mass = math.fsum(p[kept])
    assert mass >= threshold - 1e-9
    assert len(kept) == 1 or math.fsum(p[order[: len(kept) - 1]]) < threshold + 1e-9


@settings(max_examples=100, deadline=None)
@given(st.lists(finite_logit, min_size=2, max_size=10), st.floats(-50.0, 50.0), st.integers(1, 10),
       st.floats(0.05, 1.0), st.floats(0.0, 1.0))
def test_shifting_all_logits_keeps_supports(z, shift, k, p, alpha):
    # Round so the shift itself is exact and ties stay ties.
    base = np.round(np.array(z), 3)
    shifted = base + np.round(shift, 3)
    a, b = softmax(base), softmax(shifted)
    assert support(top_k_filter(a, k)) == support(top_k_filter(b, k))
    assert support(top_p_filter(a, p)) == support(top_p_filter(b, p)) or \
        abs(np.sort(a)[::-1].cumsum() - p).min() < 1e-9  # an exact threshold hit may flip under rounding
    assert min_p_support_from_logits(base, 1.0, alpha) == min_p_support_from_logits(shifted, 1.0, alpha) \
        or alpha > 0 and abs((base - base.max()) - math.log(alpha)).min() < 1e-9


@settings(max_examples=100, deadline=None)
@given(st.lists(finite_logit, min_size=2, max_size=10), st.floats(0.05, 0.95))
def test_min_p_support_grows_with_temperature_and_smaller_alpha(z, alpha):
    temps = (0.2, 0.5, 1.0, 2.0, 5.0)
    sets = [set(min_p_support_from_logits(z, t, alpha)) for t in temps]
    assert all(small <= large for small, large in zip(sets, sets[1:]))
    alphas = (alpha, alpha / 2, alpha / 10, 0.0)
    by_alpha = [set(min_p_support_from_logits(z, 1.0, a)) for a in alphas]
    assert all(small <= large for small, large in zip(by_alpha, by_alpha[1:]))
    assert int(np.argmax(z)) in sets[0]


@settings(max_examples=100, deadline=None)
@given(logit_vectors, st.lists(st.integers(0, 11), max_size=6))
def test_masks_never_unmask(z, allowed):
    allowed = [i for i in allowed if i < len(z)] or [0]
    masked = apply_hard_mask(z, allowed)
    if not np.isfinite(masked).any():
        with pytest.raises(ValueError, match="logits"):
            softmax(masked)
        return
    p = softmax(masked)
    assert set(support(p)) <= set(allowed)
    assert all(p[i] == 0.0 for i, x in enumerate(z) if x == -math.inf)


# -------------------------------------------------------------------------------------------------
# Bad input
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [[1.0, float("nan")], [1.0, float("inf")], [], [-math.inf, -math.inf]])
def test_bad_logits_raise(bad):
    with pytest.raises(ValueError, match="logits"):
        softmax(bad)
    with pytest.raises(ValueError, match="logits"):
        greedy(bad)


def test_logits_must_be_one_dimensional_numbers():
    with pytest.raises(ValueError, match="logits"):
        softmax([[1.0, 2.0]])
    with pytest.raises(TypeError, match="logits"):
        softmax(["a", "b"])


@pytest.mark.parametrize("t", [0.0, -1.0, float("nan"), float("inf")])
def test_temperature_probs_rejects_non_positive(t):
    with pytest.raises(ValueError, match="temperature"):
        temperature_probs([1.0, 2.0], t)


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5, float("nan")])
def test_top_p_range(p):
    with pytest.raises(ValueError, match=r"p must be in \(0"):
        top_p_filter([0.5, 0.5], p)


@pytest.mark.parametrize("k, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)])
def test_top_k_range(k, error):
    with pytest.raises(error, match="k must be"):
        top_k_filter([0.5, 0.5], k)


@pytest.mark.parametrize("alpha", [-0.1, 1.1])
def test_min_p_alpha_range(alpha):
    with pytest.raises(ValueError, match="alpha"):
        min_p_filter([0.5, 0.5], alpha)
    with pytest.raises(ValueError, match="alpha"):
        min_p_support_from_logits([1.0, 2.0], 1.0, alpha)


def test_typical_mass_range_and_probability_checks():
    with pytest.raises(ValueError, match="mass"):
        typical_filter([0.5, 0.5], 0.0)
    with pytest.raises(ValueError, match="probs"):
        top_k_filter([0.5, 0.6], 1)
    with pytest.raises(ValueError, match="probs"):
        top_k_filter([1.5, -0.5], 1)


def test_penalty_and_mask_argument_checks():
    with pytest.raises(ValueError, match="penalty"):
        apply_repetition_penalty([1.0], [0], 0.0)
    with pytest.raises(ValueError, match="seen_ids"):
        apply_repetition_penalty([1.0], [1], 1.2)
    with pytest.raises(ValueError, match="counts"):
        apply_frequency_presence([1.0, 2.0], [1], 0.1, 0.1)
    with pytest.raises(ValueError, match="allowed_ids"):
        apply_hard_mask([1.0, 2.0], [])
    with pytest.raises(ValueError, match="banned"):
        ban_sequences([1.0, 2.0], [], [()])
    with pytest.raises(ValueError, match="n must be"):
        no_repeat_ngram_mask([1.0, 2.0], [0], 0)
    with pytest.raises(TypeError, match="rng"):
        sample([1.0], rng=np.random.RandomState(0))


@pytest.mark.parametrize("field, value, error", [
    ("temperature", -0.5, ValueError),
    ("top_k", 0, ValueError),
    ("top_k", 2.5, TypeError),
    ("top_p", 0.0, ValueError),
    ("top_p", 1.01, ValueError),
    ("min_p", 1.5, ValueError),
    ("typical_p", 0.0, ValueError),
    ("frequency_penalty", 2.5, ValueError),
    ("presence_penalty", -2.5, ValueError),
    ("repetition_penalty", 0.0, ValueError),
    ("no_repeat_ngram_size", -1, ValueError),
    ("allowed_token_ids", (), ValueError),
    ("max_tokens", 0, ValueError),
    ("seed", -1, ValueError),
    ("n", 0, ValueError),
    ("ignore_eos", "yes", TypeError),
])
def test_sampling_params_field_validation(field, value, error):
    with pytest.raises(error, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("kwargs, pattern", [
    ({"filter_order": ("top_k", "beam")}, "filter_order"),
    ({"filter_order": ("top_k", "top_k")}, "filter_order"),
    ({"filter_order": "top_k"}, "filter_order"),
    ({"filter_order": ("top_p",), "top_k": 3}, "filter_order"),
    ({"stop": ("",)}, "stop"),
    ({"logit_bias": {1: float("nan")}}, "logit_bias"),
    ({"logit_bias": [(1, 0.5), (1, 0.2)]}, "logit_bias"),
    ({"banned_sequences": [()]}, "banned_sequences"),
])
def test_sampling_params_structure_validation(kwargs, pattern):
    with pytest.raises((ValueError, TypeError), match=pattern):
        SamplingParams(**kwargs)


def test_filter_names_are_the_default_order():
    assert SamplingParams().filter_order == FILTER_NAMES == ("top_k", "top_p", "min_p", "typical")


def test_beam_search_argument_checks():
    def step(sequences):
        return np.zeros((len(sequences), 3))

    with pytest.raises(ValueError, match="beam_width"):
        beam_search(step, [0], beam_width=0, max_new_tokens=2)
    with pytest.raises(ValueError, match="length_alpha"):
        beam_search(step, [0], beam_width=1, max_new_tokens=2, length_alpha=-1.0)
    with pytest.raises(ValueError, match="step_logprobs"):
        beam_search(lambda s: np.zeros(3), [0], beam_width=1, max_new_tokens=2)
    with pytest.raises(ValueError, match="n must be"):
        best_of_n_kv_tokens(10, 5, 0)


# ------------------------------------------------------------ the pipeline chapter's worked numbers


def test_power_form_of_temperature_equals_softmax_of_scaled_logits():
    from servelab.sampling import temperature_from_probs, temperature_probs

    z = [4.0, 3.0, 2.0, 1.0]
    for t in (0.1, 0.5, 1.0, 2.0, 7.0):
        assert np.allclose(temperature_from_probs(softmax(z), t), temperature_probs(z, t), atol=1e-12)
    p = softmax(z)
    assert np.allclose(temperature_from_probs([0.5, 0.5, 0.0], 0.3), [0.5, 0.5, 0.0])
    assert np.allclose((p / 2) / (p / 2).sum(), p)  # dividing p by T = 2 does nothing
    with pytest.raises(ValueError, match="temperature"):
        temperature_from_probs(p, 0.0)


def test_nucleus_size_adapts_at_p_09():
    assert support(top_p_filter([0.98, 0.01, 0.01], 0.9)) == [0]
    assert len(support(top_p_filter([0.1] * 10, 0.9))) == 9  # nine in exact arithmetic, and here


def test_four_word_top_p_08_against_temperature():
    z = [4.0, 3.0, 2.0, 1.0]
    kept = {t: support(next_token_distribution(z, SamplingParams(temperature=t, top_p=0.8)))
            for t in (0.5, 1.0, 2.0)}
    assert kept == {0.5: [0], 1.0: [0, 1], 2.0: [0, 1, 2]}
    final = next_token_distribution(z, SamplingParams(temperature=1.0, top_p=0.8))
    assert np.round(100 * final[:2], 3).tolist() == [73.106, 26.894]
    combo = next_token_distribution(z, SamplingParams(temperature=2.0, top_k=3, top_p=0.8))
    assert np.round(100 * combo[:2], 3).tolist() == [62.246, 37.754]
