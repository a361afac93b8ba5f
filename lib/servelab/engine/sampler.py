"""Batched torch sampler: the reference pipeline of ``servelab.sampling`` applied to many rows at once.

Stages, in the order of :func:`servelab.sampling.next_token_distribution`: hard constraints (allowed ids,
banned sequences, no-repeat n-grams) and logit bias -> penalties (frequency/presence on generated tokens,
repetition on prompt + output) -> the row's grammar mask (structured outputs, :mod:`servelab.grammar`;
the reference pipeline has no such stage) -> temperature (``T = 0`` is a separate greedy branch) -> truncation filters
in each row's ``filter_order`` -> renormalise -> inverse-CDF draw.

Reproducibility: each sampling row (temperature > 0) draws exactly one uniform per step from its own
request's ``torch.Generator``, so a seeded request's tokens do not depend on which other requests share
the batch. Greedy rows draw nothing: their token never depends on a uniform. The probability maths runs
in float64 so that support sets match the numpy reference.

The truncation filters themselves (top-k, top-p, min-p, typical) are in :mod:`servelab.engine.truncation`,
log-probabilities in :mod:`servelab.engine.logprobs`: neither runs unless a request asks for it.

System boundary: logits ``[rows, vocab]`` in (any device), one token id per row out. Which rows exist and
what they have generated so far is the engine's business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from servelab.sampling.params import SamplingParams
from servelab.engine.truncation import FILTERS


@dataclass
class SamplingRow:
    """One request's inputs to one decode step."""

    params: SamplingParams
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    generator: torch.Generator  # CPU generator owned by the request
    grammar_mask: torch.Tensor | None = None  # bool [vocab]: the ids the request's grammar allows next


def sample_tokens(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> list[int | None]:
    """Choose one token per row of ``logits`` (``[len(rows), vocab]``).

    Returns a Python int per row, or None for a row whose hard constraints mask every token (that
    request cannot continue; the reference pipeline raises ValueError for it).
    """
    if all(_plain_greedy(r.params) and r.grammar_mask is None for r in rows):  # nothing to mask, penalise or sample
        return logits.argmax(dim=-1).tolist()
    draws = [float(torch.rand((), generator=r.generator, dtype=torch.float64)) if r.params.temperature > 0
             else 0.0 for r in rows]  # one uniform per sampling row; a greedy row's is never read
    probs, dead = next_token_probs(logits, rows)
    tokens = draw(probs, torch.tensor(draws, dtype=torch.float64, device=probs.device)).tolist()
    return [None if i in dead else t for i, t in enumerate(tokens)]


def _plain_greedy(params: SamplingParams) -> bool:
    """Greedy with no constraint or penalty: the token is the argmax of the raw logits."""
    return (params.temperature == 0 and params.allowed_token_ids is None and not params.banned_sequences
            and not params.no_repeat_ngram_size and not params.logit_bias and not params.frequency_penalty
            and not params.presence_penalty and params.repetition_penalty == 1.0)


def next_token_probs(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> tuple[torch.Tensor, set[int]]:
    """The final distribution per row, float64 ``[rows, vocab]`` (greedy rows one-hot), and the indices
    of rows that have no eligible token (their row of the result is meaningless)."""
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(f"logits must be [len(rows), vocab], got shape {tuple(logits.shape)}")
    z = logits.to(torch.float64, copy=True)
    dead = _apply_hard_constraints(z, rows)
    z = _apply_penalties(z, rows)
    dead |= _apply_grammar_masks(z, rows)
    temps = torch.tensor([r.params.temperature for r in rows], dtype=torch.float64, device=z.device)
    greedy = temps == 0
    probs = torch.softmax(z / torch.where(greedy, 1.0, temps)[:, None], dim=-1)
    probs = _apply_filters(probs, rows)
    if greedy.any():
        one_hot = torch.zeros_like(probs)
        one_hot[torch.arange(len(rows), device=z.device), z.argmax(dim=-1)] = 1.0
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs, dead


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse CDF per row: the first id whose cumulative probability exceeds ``u * total``."""
    cumulative = probs.cumsum(dim=-1)
    index = torch.searchsorted(cumulative, (uniforms * cumulative[:, -1])[:, None], right=True)[:, 0]
    ids = torch.arange(probs.shape[-1], device=probs.device)
    last_eligible = torch.where(probs > 0, ids, -1).max(dim=-1).values
    return torch.minimum(index, last_eligible)


# ----------------------------------------------------------------------------------------------- stage 1


def _apply_hard_constraints(z: torch.Tensor, rows: Sequence[SamplingRow]) -> set[int]:
    """Mask and bias ``z`` in place; rows left with no finite logit are reset to 0 and returned."""
    dead = set()
    for i, row in enumerate(rows):
        p = row.params
        if p.allowed_token_ids is not None:
            keep = torch.zeros(z.shape[-1], dtype=torch.bool, device=z.device)
            keep[list(p.allowed_token_ids)] = True
            z[i, ~keep] = -torch.inf
        banned = _banned_next_tokens(p, list(row.output_ids))
        if banned:
            z[i, banned] = -torch.inf
        for token, offset in p.logit_bias:
            z[i, token] += offset
        if not torch.isfinite(z[i]).any():
            dead.add(i)
            z[i] = 0.0
    return dead


def _banned_next_tokens(params: SamplingParams, history: list[int]) -> list[int]:
    """Tokens that would complete a banned sequence or repeat an n-gram of the generated ids."""
    banned = []
    for sequence in params.banned_sequences:
        prefix = list(sequence[:-1])
        if len(prefix) <= len(history) and history[len(history) - len(prefix):] == prefix:
            banned.append(sequence[-1])
    n = params.no_repeat_ngram_size
    if n > 0 and len(history) >= n - 1:
        context = history[len(history) - (n - 1):] if n > 1 else []
        for start in range(len(history) - n + 1):
            if history[start:start + n - 1] == context:
                banned.append(history[start + n - 1])
    return banned


# ----------------------------------------------------------------------------------------------- stage 2


def _apply_penalties(z: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    for i, row in enumerate(rows):
        p = row.params
        if p.frequency_penalty or p.presence_penalty:
            counts = torch.zeros(z.shape[-1], dtype=torch.float64, device=z.device)
            if row.output_ids:
                ids = torch.tensor(list(row.output_ids), device=z.device)
                counts.index_add_(0, ids, torch.ones(len(ids), dtype=torch.float64, device=z.device))
            z[i] = z[i] - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted({*row.prompt_ids, *row.output_ids}), dtype=torch.long, device=z.device)
            if seen.numel():
                picked = z[i, seen]
                z[i, seen] = torch.where(picked > 0, picked / p.repetition_penalty,
                                         picked * p.repetition_penalty)
    return z


def _apply_grammar_masks(z: torch.Tensor, rows: Sequence[SamplingRow]) -> set[int]:
    """Stage 3 (before temperature): ids a row's grammar forbids get ``-inf``; rows left with nothing
    are reset to 0 and returned."""
    dead = set()
    for i, row in enumerate(rows):
        if row.grammar_mask is not None:
            z[i, ~row.grammar_mask.to(z.device)] = -torch.inf
            if not torch.isfinite(z[i]).any():
                dead.add(i)
                z[i] = 0.0
    return dead


# ----------------------------------------------------------------------------------------------- stage 4


def _apply_filters(probs: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Apply each row's enabled filters in its own order; rows sharing a (stage, filter) go together."""
    orders = [r.params.enabled_filters() if r.params.temperature > 0 else () for r in rows]
    for stage in range(max((len(o) for o in orders), default=0)):
        for name, fn in FILTERS.items():
            picked = [i for i, o in enumerate(orders) if len(o) > stage and o[stage] == name]
            if picked:
                index = torch.tensor(picked, device=probs.device)
                probs[index] = fn(probs[index], [rows[i].params for i in picked])
    return probs
