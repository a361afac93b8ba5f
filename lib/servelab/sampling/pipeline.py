"""The request-level reference pipeline: the numpy operations in the order :class:`SamplingParams`
sets.

Stages: hard constraints and logit bias -> penalties -> temperature (or the greedy branch) ->
truncation filters in ``params.filter_order`` -> renormalise -> sample. The engine's batched torch
sampler mirrors these stages one to one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from servelab.sampling.params import SamplingParams
from servelab.sampling.reference import (
    FloatVector,
    _check_logits,
    _check_probs,
    apply_frequency_presence,
    apply_hard_mask,
    apply_logit_bias,
    apply_repetition_penalty,
    ban_sequences,
    greedy,
    min_p_filter,
    no_repeat_ngram_mask,
    sample,
    temperature_probs,
    token_counts,
    top_k_filter,
    top_p_filter,
    typical_filter,
)

__all__ = [
    "apply_hard_constraints",
    "apply_penalties",
    "apply_truncation_filters",
    "next_token_distribution",
    "sample_next_token",
]


def _check_params(params: object) -> SamplingParams:
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    return params


def apply_hard_constraints(logits: FloatVector, params: SamplingParams,
                           output_ids: Sequence[int] = ()) -> np.ndarray:
    """Stage 1: allowed-token mask, banned sequences, no-repeat n-gram mask, then logit bias."""
    p = _check_params(params)
    z = _check_logits(logits)
    if p.allowed_token_ids is not None:
        z = apply_hard_mask(z, p.allowed_token_ids)
    if p.banned_sequences and np.isfinite(z).any():
        z = ban_sequences(z, output_ids, p.banned_sequences)
    if p.no_repeat_ngram_size > 0 and np.isfinite(z).any():
        z = no_repeat_ngram_mask(z, output_ids, p.no_repeat_ngram_size)
    if p.logit_bias and np.isfinite(z).any():
        z = apply_logit_bias(z, p.logit_bias)
    if not np.isfinite(z).any():
        raise ValueError("params leave no eligible token: the hard constraints mask every token")
    return z


def apply_penalties(logits: FloatVector, params: SamplingParams, prompt_ids: Sequence[int] = (),
                    output_ids: Sequence[int] = ()) -> np.ndarray:
    """Stage 2: frequency/presence penalties on output counts, repetition penalty on prompt +
    output."""
    p = _check_params(params)
    z = _check_logits(logits)
    if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
        counts = token_counts(output_ids, z.size)
        z = apply_frequency_presence(z, counts, p.frequency_penalty, p.presence_penalty)
    if p.repetition_penalty != 1.0:
        z = apply_repetition_penalty(z, [*prompt_ids, *output_ids], p.repetition_penalty)
    return z


def apply_truncation_filters(probs: FloatVector, params: SamplingParams) -> np.ndarray:
    """Stage 4: run each enabled filter in ``params.filter_order`` on the current distribution."""
    p = _check_params(params)
    current = _check_probs(probs)
    filters: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "top_k": lambda q: top_k_filter(q, p.top_k),
        "top_p": lambda q: top_p_filter(q, p.top_p),
        "min_p": lambda q: min_p_filter(q, p.min_p),
        "typical": lambda q: typical_filter(q, p.typical_p),
    }
    for name in p.enabled_filters():
        current = filters[name](current)
    return current


def next_token_distribution(
    logits: FloatVector,
    params: SamplingParams,
    prompt_ids: Sequence[int] = (),
    output_ids: Sequence[int] = (),
) -> np.ndarray:
    """The final probability vector one decode step samples from, under ``params``.

    Stages: hard constraints and logit bias -> penalties -> temperature -> truncation filters in
    ``params.filter_order`` -> renormalise. With ``temperature == 0`` the result is a one-hot vector
    at the greedy argmax of the constrained, penalised logits, taken before any division.
    ``prompt_ids`` and ``output_ids`` are the request's prompt and generated token ids so far.
    """
    p = _check_params(params)
    z = apply_hard_constraints(logits, p, output_ids)
    z = apply_penalties(z, p, prompt_ids, output_ids)
    if p.temperature == 0.0:
        one_hot = np.zeros(z.size)
        one_hot[greedy(z)] = 1.0
        return one_hot
    return apply_truncation_filters(temperature_probs(z, p.temperature), p)


def sample_next_token(logits: FloatVector, params: SamplingParams, rng: np.random.Generator,
                      prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()) -> int:
    """Build :func:`next_token_distribution` and draw one token from it with :func:`sample`.

    Every call consumes exactly one uniform from ``rng``, greedy requests included.
    """
    return sample(next_token_distribution(logits, params, prompt_ids, output_ids), rng)


# --------------------------------------------------------------------------------------------------
# Beyond one draw: beam search and best-of-n memory
