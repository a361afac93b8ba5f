"""Batched torch sampler: the reference pipeline of ``servelab.sampling`` applied to many rows at
once.

Stages, in the order of :func:`servelab.sampling.next_token_distribution`: hard constraints and
logit bias -> penalties (both in :mod:`~servelab.engine.logits_processors`) -> the grammar mask
(:mod:`~servelab.engine.structured`; the reference has no such stage) -> temperature (``T = 0`` is a
separate greedy branch) -> truncation filters in each row's ``filter_order``
(:mod:`~servelab.engine.truncation`) -> inverse-CDF draw. A stage runs only when a row asks for it.

Each sampling row (temperature > 0) draws one uniform per step from its own ``torch.Generator``, so
a seeded request's tokens do not depend on the batch; greedy rows draw none. The maths is in
float64. System boundary: logits ``[rows, vocab]`` in (any device), one token id per row out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from servelab.engine import structured
from servelab.engine.logits_processors import process_logits, uses_processors
from servelab.engine.sampling_row import SamplingRow
from servelab.engine.truncation import apply_filters
from servelab.sampling.params import SamplingParams


def sample_tokens(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> list[int | None]:
    """Choose one token per row of ``logits`` (``[len(rows), vocab]``).
    Returns a Python int per row, or None for a row whose hard constraints mask every token (that
    request cannot continue; the reference pipeline raises ValueError for it)."""
    # nothing to mask or draw
    if all(_plain_greedy(r.params) and r.grammar_mask is None for r in rows):
        return logits.argmax(dim=-1).tolist()
    draws = [
        float(torch.rand((), generator=r.generator, dtype=torch.float64))
        if r.params.temperature > 0
        else 0.0
        for r in rows
    ]  # one uniform per sampling row; a greedy row's is never read
    probs, dead = next_token_probs(logits, rows)
    tokens = draw(probs, torch.tensor(draws, dtype=torch.float64, device=probs.device)).tolist()
    return [None if i in dead else t for i, t in enumerate(tokens)]


def _plain_greedy(params: SamplingParams) -> bool:
    """Greedy with no constraint or penalty: the token is the argmax of the raw logits."""
    return params.temperature == 0 and not uses_processors(params)


def next_token_probs(
    logits: torch.Tensor, rows: Sequence[SamplingRow]
) -> tuple[torch.Tensor, set[int]]:
    """The final distribution per row, float64 ``[rows, vocab]`` (greedy rows one-hot), and the
    indices of rows that have no eligible token (their row of the result is meaningless)."""
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(f"logits must be [len(rows), vocab], got shape {tuple(logits.shape)}")
    z = logits.to(torch.float64, copy=True)
    dead = process_logits(z, rows) if any(uses_processors(r.params) for r in rows) else set()
    if any(r.grammar_mask is not None for r in rows):
        dead |= structured.mask_logits(z, rows)
    temps = torch.tensor([r.params.temperature for r in rows], dtype=torch.float64, device=z.device)
    greedy = temps == 0
    probs = torch.softmax(z / torch.where(greedy, 1.0, temps)[:, None], dim=-1)
    if any(r.params.temperature > 0 and r.params.enabled_filters() for r in rows):
        probs = apply_filters(probs, rows)
    if greedy.any():
        one_hot = torch.zeros_like(probs)
        one_hot[torch.arange(len(rows), device=z.device), z.argmax(dim=-1)] = 1.0
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs, dead


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse CDF per row: the first id whose cumulative probability exceeds ``u * total``."""
    cumulative = probs.cumsum(dim=-1)
    index = torch.searchsorted(cumulative, (uniforms * cumulative[:, -1])[:, None], right=True)[
        :, 0
    ]
    ids = torch.arange(probs.shape[-1], device=probs.device)
    last_eligible = torch.where(probs > 0, ids, -1).max(dim=-1).values
    return torch.minimum(index, last_eligible)
