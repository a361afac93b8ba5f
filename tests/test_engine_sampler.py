"""The batched torch sampler against the numpy reference pipeline of ``servelab.sampling``."""

import numpy as np
import pytest
import torch

from servelab.engine.sampler import SamplingRow, draw, next_token_probs, sample_tokens
from servelab.sampling import SamplingParams, next_token_distribution

torch.set_num_threads(1)

VOCAB = 64

PARAM_SETS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=1.0, min_p=0.1),
    SamplingParams(temperature=1.0, typical_p=0.6),
    SamplingParams(temperature=0.9, top_k=8, top_p=0.7, min_p=0.05, typical_p=0.9),
    SamplingParams(temperature=0.9, top_k=8, top_p=0.7, filter_order=("top_p", "top_k", "min_p", "typical")),
    SamplingParams(temperature=1.1, frequency_penalty=0.7, presence_penalty=-0.4, repetition_penalty=1.2),
    SamplingParams(temperature=1.0, logit_bias=((3, 5.0), (7, -2.0)), allowed_token_ids=tuple(range(0, 40))),
    SamplingParams(temperature=1.0, banned_sequences=((5, 6), (9,)), no_repeat_ngram_size=2),
]


def _history(rng):
    prompt = [int(t) for t in rng.integers(0, VOCAB, size=6)]
    output = [int(t) for t in rng.integers(0, VOCAB, size=8)] + [5]
    return prompt, output


@pytest.mark.parametrize("trial", range(4))
def test_batched_probs_match_reference(trial):
    rng = np.random.default_rng(trial)
    logits = torch.tensor(rng.normal(0, 2.5, size=(len(PARAM_SETS), VOCAB)))
    histories = [_history(rng) for _ in PARAM_SETS]
    rows = [SamplingRow(p, pr, out, torch.Generator().manual_seed(0))
            for p, (pr, out) in zip(PARAM_SETS, histories)]
    probs, dead = next_token_probs(logits, rows)
    assert not dead
    for i, (params, (prompt, output)) in enumerate(zip(PARAM_SETS, histories)):
        expected = next_token_distribution(logits[i].numpy(), params, prompt, output)
        got = probs[i].numpy()
        assert set(np.flatnonzero(got > 0)) == set(np.flatnonzero(expected > 0)), f"support of row {i}"
        np.testing.assert_allclose(got, expected, atol=1e-9, err_msg=f"row {i}")


def test_draw_is_inverse_cdf():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    assert draw(probs, torch.tensor([0.0, 0.0], dtype=torch.float64)).tolist() == [1, 0]
    assert draw(probs, torch.tensor([0.49, 0.74], dtype=torch.float64)).tolist() == [1, 2]
    assert draw(probs, torch.tensor([0.999999, 0.999999], dtype=torch.float64)).tolist() == [3, 3]


def test_seeded_rows_do_not_depend_on_batch_composition():
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    rng = np.random.default_rng(3)
    target = torch.tensor(rng.normal(0, 1.0, size=(1, VOCAB)))
    others = torch.tensor(rng.normal(0, 1.0, size=(5, VOCAB)))

    def run(with_others: bool) -> list[int]:
        gen = torch.Generator().manual_seed(params.seed)
        tokens = []
        for step in range(20):
            rows = [SamplingRow(params, [], tokens, gen)]
            batch = target
            if with_others:
                rows += [SamplingRow(SamplingParams(temperature=1.0), [], [], torch.Generator().manual_seed(step))
                         for _ in range(5)]
                batch = torch.cat([target, others])
            tokens.append(sample_tokens(batch, rows)[0])
        return tokens

    assert run(False) == run(True)


def test_row_with_no_eligible_token_is_reported():
    params_dead = SamplingParams(temperature=1.0, allowed_token_ids=(3,), banned_sequences=((3,),))
    rows = [SamplingRow(params_dead, [], [], torch.Generator().manual_seed(0)),
            SamplingRow(SamplingParams(temperature=0.0), [], [], torch.Generator().manual_seed(0))]
    logits = torch.zeros(2, VOCAB)
    logits[1, 9] = 1.0
    assert sample_tokens(logits, rows) == [None, 9]


def test_empirical_frequencies_follow_the_distribution():
    params = SamplingParams(temperature=1.0, top_k=3)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    gen = torch.Generator().manual_seed(1)
    counts = np.zeros(5)
    for _ in range(3000):
        counts[sample_tokens(logits, [SamplingRow(params, [], [], gen)])[0]] += 1
    expected = next_token_distribution(logits[0].numpy(), params)
    np.testing.assert_allclose(counts / counts.sum(), expected, atol=0.03)
    assert counts[3] == counts[4] == 0
