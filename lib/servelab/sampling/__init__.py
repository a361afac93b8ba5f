"""From one vector of next-token logits to one token id (course chapter on sampling).

* :mod:`servelab.sampling.params`: :class:`SamplingParams`, what a request says about how its tokens
  are chosen (light: the engine imports it for its configuration);
* :mod:`servelab.sampling.reference`: the numpy reference operations (softmax, temperature, the
  truncation filters, penalties, masks, the one draw) and their conventions;
* :mod:`servelab.sampling.pipeline`: those operations in the stage order a :class:`SamplingParams`
  sets;
* :mod:`servelab.sampling.beam`: beam search and the KV memory of best-of-n.
"""

from servelab.sampling.beam import BeamHypothesis, beam_search, best_of_n_kv_tokens
from servelab.sampling.params import FILTER_NAMES, SamplingParams
from servelab.sampling.pipeline import (
    apply_hard_constraints,
    apply_penalties,
    apply_truncation_filters,
    next_token_distribution,
    sample_next_token,
)
from servelab.sampling.reference import (
    MASS_TOLERANCE,
    PROB_SUM_TOLERANCE,
    apply_frequency_presence,
    apply_hard_mask,
    apply_logit_bias,
    apply_repetition_penalty,
    apply_temperature,
    ban_sequences,
    force_token,
    greedy,
    min_p_filter,
    min_p_support_from_logits,
    no_repeat_ngram_mask,
    sample,
    softmax,
    support,
    temperature_from_probs,
    temperature_probs,
    token_counts,
    top_k_filter,
    top_p_filter,
    typical_filter,
)

__all__ = [
    "FILTER_NAMES",
    "MASS_TOLERANCE",
    "PROB_SUM_TOLERANCE",
    "BeamHypothesis",
    "SamplingParams",
    "apply_frequency_presence",
    "apply_hard_constraints",
    "apply_hard_mask",
    "apply_logit_bias",
    "apply_penalties",
    "apply_repetition_penalty",
    "apply_temperature",
    "apply_truncation_filters",
    "ban_sequences",
    "beam_search",
    "best_of_n_kv_tokens",
    "force_token",
    "greedy",
    "min_p_filter",
    "min_p_support_from_logits",
    "next_token_distribution",
    "no_repeat_ngram_mask",
    "sample",
    "sample_next_token",
    "softmax",
    "support",
    "temperature_probs",
    "temperature_from_probs",
    "token_counts",
    "top_k_filter",
    "top_p_filter",
    "typical_filter",
]
