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

Log-probabilities (:func:`token_logprobs`) are the raw model's ``log_softmax`` of the same logits rows,
before any processor (vLLM's default ``raw_logprobs``), in float64: the engine reads them from the step
that sampled the token (and, for prompt tokens, from the prefill that computed them), never from a
second forward pass.

System boundary: logits ``[rows, vocab]`` in (any device), one token id per row out. Which rows exist and
what they have generated so far is the engine's business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from servelab.sampling.params import SamplingParams
from servelab.sampling.reference import MASS_TOLERANCE


@dataclass(frozen=True)
class TokenLogprob:
    """One token's raw log-probability (natural log) and the ``k`` most likely tokens at its position."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


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
        for name, fn in _FILTERS.items():
            picked = [i for i, o in enumerate(orders) if len(o) > stage and o[stage] == name]
            if picked:
                index = torch.tensor(picked, device=probs.device)
                probs[index] = fn(probs[index], [rows[i].params for i in picked])
    return probs


def _param_column(params: list[SamplingParams], name: str, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor([float(getattr(p, name)) for p in params], dtype=torch.float64, device=like.device)[:, None]


def _keep_mask(probs: torch.Tensor, order: torch.Tensor, keep_sorted: torch.Tensor) -> torch.Tensor:
    """Zero the entries whose sorted position is not kept, then renormalise each row."""
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = torch.where(keep & (probs > 0), probs, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _by_probability(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted probabilities and order: highest first, ties by smaller id (stable sort)."""
    return torch.sort(probs, dim=-1, descending=True, stable=True)


def _prefix_reaching(sorted_mass: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Keep-mask over sorted positions: the shortest prefix whose sum reaches ``threshold`` (per row)."""
    cumulative = sorted_mass.cumsum(dim=-1)
    before = cumulative - sorted_mass  # mass strictly before each position
    return before < threshold - MASS_TOLERANCE


def _top_k(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    _, order = _by_probability(probs)
    ranks = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    return _keep_mask(probs, order, ranks < _param_column(params, "top_k", probs))


def _top_p(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    sorted_p, order = _by_probability(probs)
    return _keep_mask(probs, order, _prefix_reaching(sorted_p, _param_column(params, "top_p", probs)))


def _min_p(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    threshold = _param_column(params, "min_p", probs) * probs.max(dim=-1, keepdim=True).values
    kept = torch.where(probs >= threshold, probs, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _typical(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    positive = probs > 0
    surprisal = torch.where(positive, -torch.log(torch.where(positive, probs, 1.0)), 0.0)
    entropy = (probs * surprisal).sum(dim=-1, keepdim=True)
    distance = torch.where(positive, (surprisal - entropy).abs(), torch.inf)
    order = torch.sort(distance, dim=-1, stable=True).indices
    sorted_p = probs.gather(-1, order)
    return _keep_mask(probs, order, _prefix_reaching(sorted_p, _param_column(params, "typical_p", probs)))


_FILTERS = {"top_k": _top_k, "top_p": _top_p, "min_p": _min_p, "typical": _typical}


# ----------------------------------------------------------------------------------------------- logprobs


def token_logprobs(logits: torch.Tensor, targets: Sequence[int], top_k: Sequence[int]) -> list[TokenLogprob]:
    """Per row of ``logits`` (``[rows, vocab]``): the raw log-softmax of ``targets[i]`` and the
    ``top_k[i]`` most likely tokens (ties: torch.topk's order)."""
    if logits.dim() != 2 or not logits.shape[0] == len(targets) == len(top_k):
        raise ValueError(f"logits must be [len(targets), vocab], got shape {tuple(logits.shape)}")
    if not len(targets):
        return []
    logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    index = torch.tensor(list(targets), dtype=torch.long, device=logp.device)[:, None]
    chosen = logp.gather(1, index)[:, 0].tolist()
    k = max(top_k)
    values, ids = (logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long()))
    values, ids = values.tolist(), ids.tolist()
    return [TokenLogprob(int(t), lp, tuple(zip(ids[i][:top_k[i]], values[i][:top_k[i]])))
            for i, (t, lp) in enumerate(zip(targets, chosen))]
