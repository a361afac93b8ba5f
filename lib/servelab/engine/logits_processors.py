"""Logits processors: the sampler's stages 1 and 2, for the rows whose request asks for them.

Stage 1, hard constraints and bias: ``allowed_token_ids``, ``banned_sequences``,
``no_repeat_ngram_size``, ``logit_bias``. Stage 2, penalties: frequency and presence on the
generated ids, repetition on prompt + output. Same semantics as :mod:`servelab.sampling.reference`.
A batch in which no request sets any of them (the default
:class:`~servelab.sampling.params.SamplingParams`) never calls :func:`process_logits`.

System boundary: float64 logits ``[rows, vocab]`` changed in place (any device); which rows are
dead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from servelab.sampling.params import SamplingParams

if TYPE_CHECKING:
    from servelab.engine.sampling_row import SamplingRow

__all__ = ["uses_processors", "process_logits"]


def uses_processors(params: SamplingParams) -> bool:
    """Whether a stage-1 or stage-2 processor changes this request's logits."""
    return (
        params.allowed_token_ids is not None
        or bool(params.banned_sequences)
        or bool(params.logit_bias)
        or bool(params.no_repeat_ngram_size)
        or bool(params.frequency_penalty)
        or bool(params.presence_penalty)
        or params.repetition_penalty != 1.0
    )


def process_logits(z: torch.Tensor, rows: Sequence["SamplingRow"]) -> set[int]:
    """Stages 1 then 2 on ``z`` in place; returns the rows left with no finite logit (reset to
    0)."""
    dead = _apply_hard_constraints(z, rows)
    _apply_penalties(z, rows)
    return dead


def _apply_hard_constraints(z: torch.Tensor, rows: Sequence["SamplingRow"]) -> set[int]:
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


def _apply_penalties(z: torch.Tensor, rows: Sequence["SamplingRow"]) -> None:
    """Frequency and presence penalties on the generated ids, the repetition penalty on prompt +
    output."""
    for i, row in enumerate(rows):
        p = row.params
        if p.frequency_penalty or p.presence_penalty:
            counts = torch.zeros(z.shape[-1], dtype=torch.float64, device=z.device)
            if row.output_ids:
                ids = torch.tensor(list(row.output_ids), device=z.device)
                counts.index_add_(
                    0, ids, torch.ones(len(ids), dtype=torch.float64, device=z.device)
                )
            z[i] = z[i] - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(
                sorted({*row.prompt_ids, *row.output_ids}), dtype=torch.long, device=z.device
            )
            if seen.numel():
                picked = z[i, seen]
                z[i, seen] = torch.where(picked > 0, picked / p.repetition_penalty,
                                         picked * p.repetition_penalty)
