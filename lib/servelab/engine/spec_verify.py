"""Speculative decoding's verification inside the engine step, and its counters (vLLM's names).

A verify row of ``k`` drafts gives ``k + 1`` logits rows: row ``i`` is the target's next-token
logits after the sequence's tokens and the first ``i`` drafts. :func:`verify` turns them into the
tokens the step emits, exactly as one-token decoding would distribute them:

* greedy (temperature 0): the longest prefix of drafts equal to the target's argmax, then the argmax
  at the first mismatch (the correction), or after all ``k`` (the bonus token): the same tokens as
  plain greedy decoding;
* sampling: the accept/residual rule of :func:`servelab.optimizations.speculative.verify_draft`, on
  the target's final distribution (penalties, temperature, filters applied with the drafts as output
  so far) and the drafts' ``q`` (a point mass for n-gram drafts: keep ``x`` with probability
  ``p(x)``, else draw from ``p`` without ``x``, renormalised). Its randomness is one ``numpy``
  generator seeded from the sequence's own ``torch.Generator``, so a seeded request is reproducible.

The engine then keeps the KV of the last token and the accepted drafts and rolls the rest back
(``Scheduler.commit_verified``). System boundary: logits in, token ids and counts out; nothing here
touches the KV pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from servelab.engine.sampler import SamplingRow, next_token_probs
from servelab.engine.logits_processors import uses_processors

if TYPE_CHECKING:
    from servelab.engine.sequence import EngineSequence

__all__ = ["SpecDecodingStats", "Verified", "verify"]


@dataclass(frozen=True)
class Verified:
    """One verify row's outcome: ``tokens`` = the ``accepted`` drafts then one correction or bonus
    token (None there: the request's hard constraints leave no eligible token)."""

    tokens: list[int | None]
    accepted: int


def verify(logits: torch.Tensor, seq: "EngineSequence", drafts: tuple[int, ...],
           draft_probs: list[torch.Tensor] | None = None,
           grammar_masks: list[torch.Tensor] | None = None) -> Verified:
    """Verify ``drafts`` of ``seq`` against ``logits`` (float ``[len(drafts) + 1, vocab]``, the
    verify row's logits). ``draft_probs``: the distributions the drafts were drawn from (None: point
    masses).
    ``grammar_masks``: for a request with a grammar, the ids allowed at each row (bool ``[vocab]``
    each, :func:`~servelab.engine.structured.verify_masks`), applied as in one-token sampling."""
    k = len(drafts)
    if logits.dim() != 2 or logits.shape[0] != k + 1:
        raise ValueError(
            f"logits must be [len(drafts) + 1, vocab] = [{k + 1}, vocab], got {tuple(logits.shape)}"
        )
    if grammar_masks is not None and len(grammar_masks) != k + 1:
        raise ValueError(f"grammar_masks must hold len(drafts) + 1 = {k + 1} masks, "
                         f"got {len(grammar_masks)}")
    params = seq.params
    if params.temperature == 0 and not uses_processors(params) and grammar_masks is None:
        return _greedy(logits.argmax(dim=-1).tolist(), drafts, set())
    masks = grammar_masks or [None] * (k + 1)
    rows = [SamplingRow(params, seq.prompt_ids, seq.output_ids + list(drafts[:i]), seq.generator,
                        masks[i]) for i in range(k + 1)]
    probs, dead = next_token_probs(logits, rows)
    if params.temperature == 0:
        return _greedy(probs.argmax(dim=-1).tolist(), drafts, dead)
    first_dead = min(dead, default=k + 1)
    drafts = drafts[:first_dead]  # past a row with no eligible token nothing can be emitted
    p_rows = [
        _normalised(probs[i]) if i != first_dead else np.full(probs.shape[-1], 1 / probs.shape[-1])
        for i in range(len(drafts) + 1)
    ]
    if draft_probs is None:
        q_rows = [_point_mass(token, probs.shape[-1]) for token in drafts]
    else:
        q_rows = [_normalised(q) for q in draft_probs[:len(drafts)]]
    # it imports the engine: not at module level
    from servelab.optimizations.speculative import verify_draft

    rng = np.random.default_rng(int(torch.randint(0, 2**62, (), generator=seq.generator)))
    if not drafts:
        return Verified([None if first_dead == 0 else _draw(p_rows[0], rng)], 0)
    verdict = verify_draft(p_rows, q_rows, drafts, rng)
    tokens: list[int | None] = list(verdict.tokens)
    if verdict.accepted == first_dead:
        tokens[-1] = None
    return Verified(tokens, verdict.accepted)


def _greedy(targets: list[int], drafts: tuple[int, ...], dead: set[int]) -> Verified:
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted] and accepted not in dead:
        accepted += 1
    last = None if accepted in dead else targets[accepted]
    return Verified(list(drafts[:accepted]) + [last], accepted)


def _normalised(row: torch.Tensor) -> np.ndarray:
    p = row.detach().to("cpu", torch.float64).numpy()
    return p / p.sum()


def _point_mass(token: int, size: int) -> np.ndarray:
    q = np.zeros(size)
    q[token] = 1.0
    return q


def _draw(p: np.ndarray, rng: np.random.Generator) -> int:
    return int(
        min(np.searchsorted(np.cumsum(p), rng.random(), side="right"), np.flatnonzero(p)[-1])
    )


@dataclass
class SpecDecodingStats:
    """Counters over every verify row so far, as vLLM names them (its Prometheus counters are
    ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and
    ``..._num_accepted_tokens_per_pos`` with a ``position`` label). A *draft* is one verify row with
    at least one proposal; position ``i`` counts drafts whose ``i``-th proposal was accepted."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verify row of ``num_draft_tokens`` proposals, ``num_accepted_tokens`` kept."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify row: ``1 + accepted / drafts`` (vLLM's definition; NaN before
        any)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed tokens (NaN before any)."""
        return (
            self.num_accepted_tokens / self.num_draft_tokens
            if self.num_draft_tokens
            else float("nan")
        )
