"""Structured outputs in the engine's step: the grammar masks of the rows whose request has
``params.grammar``.

Only such requests run this (:mod:`servelab.sampling.grammar` holds the grammars and the xgrammar
matchers): each sample gets its matcher at its first sampled step, the sampler masks the ids the
grammar forbids next, and every drawn token advances the matcher.

With speculative decoding the matcher walks along the drafts and comes back, as in vLLM V1
(``StructuredOutputGrammar.validate_tokens`` when drafts reach the scheduler,
``grammar_bitmask`` with one mask per draft position plus one, ``rollback`` after both):

* :func:`grammar_prefix`: the drafts the grammar accepts, each checked in the state the drafts
  before it lead to; the first one it refuses ends the draft (the proposer calls it);
* :func:`verify_masks`: the ``k + 1`` masks of a verify row, mask ``i`` after ``i`` drafts;
* :func:`advance`: the tokens a verify row emitted move the matcher for good.

Each walk rolls the matcher back to where it was (xgrammar keeps its history: ``rollback(n)``), so a
rejected draft leaves nothing behind in the grammar state.

System boundary: bool masks ``[vocab]`` per row out, the samples' matchers advanced; no logits
touched here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from servelab.sampling import grammar

if TYPE_CHECKING:
    from servelab.engine.sampling_row import SamplingRow
    from servelab.engine.sequence import EngineSequence

__all__ = ["grammar_masks", "mask_logits", "accept_tokens", "grammar_prefix", "verify_masks",
           "advance"]


def grammar_masks(seqs: list["EngineSequence"], vocab_size: int) -> dict[int, torch.Tensor]:
    """Row -> the ids its grammar allows next, for the rows whose request has ``params.grammar``."""
    rows = [i for i, s in enumerate(seqs) if s.params.grammar is not None]
    if not rows:
        return {}
    return dict(zip(rows, grammar.allowed_masks([_matcher(seqs[i]) for i in rows], vocab_size)))


def mask_logits(z: torch.Tensor, rows: list["SamplingRow"]) -> set[int]:
    """The sampler's stage 3 (before temperature), in place on float64 logits ``z`` ``[rows,
    vocab]``: ids a row's grammar forbids get ``-inf``; rows left with nothing are reset to 0 and
    returned."""
    dead = set()
    for i, row in enumerate(rows):
        if row.grammar_mask is not None:
            z[i, ~row.grammar_mask.to(z.device)] = -torch.inf
            if not torch.isfinite(z[i]).any():
                dead.add(i)
                z[i] = 0.0
    return dead


def accept_tokens(
    seqs: list["EngineSequence"], masks: dict[int, torch.Tensor], tokens: list[int | None]
) -> None:
    """Advance the matcher of every masked row by the token it drew (a row left with no token is
    skipped)."""
    for i in masks:
        if tokens[i] is not None:
            grammar.accept(seqs[i].matcher, tokens[i])


def grammar_prefix(seq: "EngineSequence", drafts: list[int]) -> list[int]:
    """The longest prefix of ``drafts`` that ``seq``'s grammar allows after its tokens so far:
    each draft checked in the state the drafts before it lead to (an id the grammar forbids, e.g.
    a raw control character in JSON, counts as refused). The matcher ends where it started."""
    matcher, kept = _matcher(seq), 0
    for token in drafts:
        if (matcher.inner.is_terminated() or _forbidden(matcher, token)
                or not grammar.accept(matcher, token)):
            break
        kept += 1
    if kept:
        matcher.inner.rollback(kept)
    return drafts[:kept]


def verify_masks(
    seq: "EngineSequence", drafts: tuple[int, ...], vocab_size: int
) -> list[torch.Tensor]:
    """Bool ``[vocab_size]`` per row of ``seq``'s verify row: row ``i`` holds the ids the grammar
    allows after the first ``i`` drafts. Past a draft the grammar refuses, or past its end, nothing
    is allowed. The matcher ends where it started."""
    matcher, masks, advanced = _matcher(seq), [], 0
    for i in range(len(drafts) + 1):
        if matcher.inner.is_terminated() or advanced < i:  # it ended, or refused drafts[i - 1]
            masks.append(torch.zeros(vocab_size, dtype=torch.bool))
            continue
        masks.append(grammar.allowed_masks([matcher], vocab_size)[0])
        if i < len(drafts) and masks[i][drafts[i]] and grammar.accept(matcher, drafts[i]):
            advanced += 1
    if advanced:
        matcher.inner.rollback(advanced)
    return masks


def advance(seq: "EngineSequence", tokens: list[int | None]) -> None:
    """Move ``seq``'s matcher by the tokens its verify row emitted (a trailing None: no token)."""
    for token in tokens:
        if token is not None:
            grammar.accept(_matcher(seq), token)


def _matcher(seq: "EngineSequence") -> grammar.Matcher:
    """``seq``'s matcher, made at its first use."""
    if seq.matcher is None:
        seq.matcher = grammar.new_matcher(seq.params.grammar)
    return seq.matcher


def _forbidden(matcher: grammar.Matcher, token: int) -> bool:
    return matcher.forbidden is not None and bool(matcher.forbidden[token])
