"""Structured outputs in the engine's step: the grammar masks of the rows whose request has ``params.grammar``.

Only such requests run this (:mod:`servelab.grammar` holds the grammars and the xgrammar matchers): each
sample gets its matcher at its first sampled step, the sampler masks the ids the grammar forbids next,
and every drawn token advances the matcher.

System boundary: bool masks ``[vocab]`` per row out, the samples' matchers advanced; no logits touched here.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceOf
from typing import TYPE_CHECKING

import torch

from servelab import grammar

if TYPE_CHECKING:
    from servelab.engine.sequence import Sequence

__all__ = ["grammar_masks", "accept_tokens"]


def grammar_masks(seqs: SequenceOf["Sequence"], vocab_size: int) -> dict[int, torch.Tensor]:
    """Row -> the ids its grammar allows next, for the rows whose request has ``params.grammar``."""
    rows = [i for i, s in enumerate(seqs) if s.params.grammar is not None]
    for i in rows:
        if seqs[i].matcher is None:
            seqs[i].matcher = grammar.new_matcher(seqs[i].params.grammar)
    return dict(zip(rows, grammar.allowed_masks([seqs[i].matcher for i in rows], vocab_size))) if rows else {}


def accept_tokens(seqs: SequenceOf["Sequence"], masks: dict[int, torch.Tensor], tokens: SequenceOf[int | None]) -> None:
    """Advance the matcher of every masked row by the token it drew (a row left with no token is skipped)."""
    for i in masks:
        if tokens[i] is not None:
            grammar.accept(seqs[i].matcher, tokens[i])
