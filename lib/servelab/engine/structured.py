"""Structured outputs in the engine's step: the grammar masks of the rows whose request has ``params.grammar``.

Only such requests run this (:mod:`servelab.sampling.grammar` holds the grammars and the xgrammar matchers): each
sample gets its matcher at its first sampled step, the sampler masks the ids the grammar forbids next,
and every drawn token advances the matcher.

System boundary: bool masks ``[vocab]`` per row out, the samples' matchers advanced; no logits touched here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from servelab.sampling import grammar

if TYPE_CHECKING:
    from servelab.engine.sampling_row import SamplingRow
    from servelab.engine.sequence import Sequence

__all__ = ["grammar_masks", "mask_logits", "accept_tokens"]


def grammar_masks(seqs: list["Sequence"], vocab_size: int) -> dict[int, torch.Tensor]:
    """Row -> the ids its grammar allows next, for the rows whose request has ``params.grammar``."""
    rows = [i for i, s in enumerate(seqs) if s.params.grammar is not None]
    for i in rows:
        if seqs[i].matcher is None:
            seqs[i].matcher = grammar.new_matcher(seqs[i].params.grammar)
    return dict(zip(rows, grammar.allowed_masks([seqs[i].matcher for i in rows], vocab_size))) if rows else {}


def mask_logits(z: torch.Tensor, rows: list["SamplingRow"]) -> set[int]:
    """The sampler's stage 3 (before temperature), in place on float64 logits ``z`` ``[rows, vocab]``: ids a
    row's grammar forbids get ``-inf``; rows left with nothing are reset to 0 and returned."""
    dead = set()
    for i, row in enumerate(rows):
        if row.grammar_mask is not None:
            z[i, ~row.grammar_mask.to(z.device)] = -torch.inf
            if not torch.isfinite(z[i]).any():
                dead.add(i)
                z[i] = 0.0
    return dead


def accept_tokens(seqs: list["Sequence"], masks: dict[int, torch.Tensor], tokens: list[int | None]) -> None:
    """Advance the matcher of every masked row by the token it drew (a row left with no token is skipped)."""
    for i in masks:
        if tokens[i] is not None:
            grammar.accept(seqs[i].matcher, tokens[i])
