"""Beyond one draw: beam search over a step function, and the KV memory of best-of-n sampling."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from servelab._validate import require_index, require_interval
from servelab.sampling.params import as_int_tuple

__all__ = ["BeamHypothesis", "beam_search", "best_of_n_kv_tokens"]


@dataclass(frozen=True)
class BeamHypothesis:
    """One finished beam: generated token ids, total log-probability (nats) and normalised score."""

    token_ids: tuple[int, ...]
    log_prob: float
    score: float
    ended_with_eos: bool = False


def _length_normalised(log_prob: float, length: int, length_alpha: float) -> float:
    """``S(y) = log P(y) / |y| ** alpha`` with ``|y|`` the generated length."""
    return log_prob / (max(length, 1) ** length_alpha)


def beam_search(
    step_logprobs: Callable[[list[tuple[int, ...]]], np.ndarray],
    prompt_ids: Sequence[int],
    beam_width: int,
    max_new_tokens: int,
    eos_id: int | None = None,
    length_alpha: float = 1.0,
) -> list[BeamHypothesis]:
    """Approximate the most likely continuation by keeping the ``beam_width`` best partial
    sequences.

    ``step_logprobs(sequences)`` receives the live sequences (prompt + generated, as tuples) and
    returns a 2-D array of next-token log-probabilities, one row per sequence. Each step scores
    every extension by cumulative ``log P``, keeps the best ``beam_width`` (ties: earlier beam, then
    smaller token id), and retires an extension that emits ``eos_id`` as finished when it ranks
    within the top ``beam_width``; the live set is refilled from the remaining extensions. Because
    everything outside the beam is pruned, the result is not guaranteed to be globally optimal. The
    final ranking uses ``S(y) = log P(y) / |y| ** length_alpha`` (``|y|`` counts generated tokens,
    EOS included), one common normalisation among several. Returns at most ``beam_width``
    hypotheses, best first.
    """
    if not callable(step_logprobs):
        raise TypeError("step_logprobs must be callable: sequences -> 2-D array of log-probs")
    prompt = as_int_tuple(prompt_ids, "prompt_ids")
    width = require_index("beam_width", beam_width, 1)
    steps = require_index("max_new_tokens", max_new_tokens, 1)
    if eos_id is not None:
        (eos_id,) = as_int_tuple([eos_id], "eos_id")
    alpha = require_interval("length_alpha", length_alpha, 0.0, math.inf, high_open=True)

    live: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    finished: list[tuple[tuple[int, ...], float, bool]] = []
    for _ in range(steps):
        table = np.asarray(
            step_logprobs([prompt + generated for generated, _ in live]), dtype=np.float64
        )
        if table.ndim != 2 or table.shape[0] != len(live):
            raise ValueError(
                f"step_logprobs must return shape ({len(live)}, vocab), got {table.shape}"
            )
        totals = np.array([lp for _, lp in live])[:, None] + table
        flat = np.argsort(-totals, axis=None, kind="stable")  # row-major: earlier beam, smaller id
        next_live: list[tuple[tuple[int, ...], float]] = []
        for rank, index in enumerate(flat):
            beam, token = divmod(int(index), table.shape[1])
            total = float(totals[beam, token])
            if len(next_live) == width or not math.isfinite(total):
                break
            extended = live[beam][0] + (token,)
            if token == eos_id:
                if rank < width:
                    finished.append((extended, total, True))
            else:
                next_live.append((extended, total))
        live = next_live
        if not live:
            break
    finished.extend((generated, lp, False) for generated, lp in live)
    hypotheses = [BeamHypothesis(tokens, lp, _length_normalised(lp, len(tokens), alpha), eos)
                  for tokens, lp, eos in finished]
    hypotheses.sort(key=lambda h: -h.score)
    return hypotheses[:width]


def best_of_n_kv_tokens(prompt_tokens: int, generated_tokens: int, n: int,
                        shared_prefix: bool = True) -> int:
    """KV-cache size, in token slots, of ``n`` parallel samples of one prompt.

    With the prompt's KV shared copy-on-write, ``M = M_prompt + n * M_gen``; without sharing every
    sample holds its own copy, ``M = n * (M_prompt + M_gen)``. Multiply by bytes per token (see
    ``servelab.kv``) for bytes. Block rounding is ignored here.
    """
    prompt = require_index("prompt_tokens", prompt_tokens, 0)
    generated = require_index("generated_tokens", generated_tokens, 0)
    samples = require_index("n", n, 1)
    if not isinstance(shared_prefix, bool):
        raise TypeError(f"shared_prefix must be a bool, got {type(shared_prefix).__name__}")
    return prompt + samples * generated if shared_prefix else samples * (prompt + generated)
