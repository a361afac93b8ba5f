"""Speculative decoding's proposers: the draft tokens a decoding sequence brings to the next forward
pass.

The scheduler asks :meth:`Proposer.propose` for at most ``limit`` drafts when it schedules a
decoding sequence (``Scheduler.propose``); the engine verifies them in the same forward pass as
everything else (:mod:`~servelab.engine.spec_verify`). Two proposers, chosen by
``EngineConfig.speculative_config``:

* :class:`NgramProposer`: prompt lookup over the sequence's own tokens
  (:class:`servelab.optimizations.speculative.PromptLookupProposer`), no forward pass; its drafts
  are deterministic, so their draft distribution ``q`` is a point mass;
* :class:`DraftModelProposer`: a small model run ``k`` times per step, one
  :class:`servelab.optimizations.speculative.KVSession` (private KV with rollback) per running
  sequence; drafts are drawn from ``q``, the draft's distribution after the request's sampling
  transforms, with the sequence's own generator, and ``q`` is kept for the verification.

A sequence with a grammar (structured output) keeps only the drafts its grammar allows, each checked
in the state the drafts before it lead to: the first one refused ends the draft there
(:func:`~servelab.engine.structured.grammar_prefix`, vLLM V1's ``validate_tokens``). A draft
model drafts under the grammar's mask as well, so its ``q`` is the distribution the drafts really
came from and the accept/residual rule stays exact; the verify row's masks and the rollback of the
grammar state are :mod:`~servelab.engine.structured`'s.

System boundary: token ids in, token ids (and draft distributions) out; the draft model's KV lives
in host or device memory of its own, outside the engine's block pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from servelab.engine import structured
from servelab.engine.sampler import SamplingRow, draw, next_token_probs
from servelab.engine.spec_config import SpeculativeConfig
from servelab.model.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from servelab.engine.sequence import EngineSequence
    from servelab.optimizations.speculative import KVSession

__all__ = ["DraftModelProposer", "NgramProposer", "Proposer", "make_proposer"]


class Proposer:
    """The interface the engine drives: :meth:`propose` within the caps every proposer shares,
    :meth:`draft_probs` for the verification, :meth:`keep_only` when sequences leave the running
    queue."""

    def __init__(self, num_speculative_tokens: int, max_model_len: int) -> None:
        self.k = num_speculative_tokens
        self.max_model_len = max_model_len

    def propose(self, seq: "EngineSequence", limit: int) -> list[int]:
        """At most ``min(k, limit)`` drafts after ``seq``'s last token, never past ``max_tokens`` or
        the context limit (every draft accepted still leaves room for the bonus token), cut at the
        first one that the sequence's grammar refuses (if it has one)."""
        room = min(self.k, limit, seq.remaining_tokens - 1, self.max_model_len - seq.num_tokens - 1)
        if room < 1:
            return []
        drafts = self._draft(seq, room)
        return drafts if seq.params.grammar is None else structured.grammar_prefix(seq, drafts)

    def draft_probs(
        self, seq: "EngineSequence", drafts: tuple[int, ...]
    ) -> list[torch.Tensor] | None:
        """The distributions ``drafts`` were drawn from (float64 ``[vocab]`` each), None for point
        masses."""
        return None

    def keep_only(self, seq_ids: set[str]) -> None:
        """Drop whatever is kept for sequences not in ``seq_ids`` (no longer running)."""

    def _draft(self, seq: "EngineSequence", count: int) -> list[int]:
        raise NotImplementedError


class NgramProposer(Proposer):
    """vLLM's ``"ngram"`` method: the tokens that followed the latest earlier occurrence of the
    sequence's last n-gram, ``n`` from ``prompt_lookup_max`` down to ``prompt_lookup_min``."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        # it imports the engine: not at module level
        from servelab.optimizations.speculative import PromptLookupProposer

        super().__init__(config.num_speculative_tokens, max_model_len)
        self.lookup = PromptLookupProposer(config.prompt_lookup_max, config.prompt_lookup_min)

    def _draft(self, seq: "EngineSequence", count: int) -> list[int]:
        return self.lookup.propose(seq.token_ids, count)


class DraftModelProposer(Proposer):
    """vLLM's ``"draft_model"`` method: ``count`` autoregressive steps of a draft model per
    proposal, its KV kept per sequence and rolled back to what the sequence really holds before each
    proposal."""

    def __init__(
        self, config: SpeculativeConfig, draft: LlamaForCausalLM, max_model_len: int
    ) -> None:
        super().__init__(config.num_speculative_tokens, max_model_len)
        self.model = draft
        self.sessions: dict[str, "KVSession"] = {}
        self._probs: dict[str, list[torch.Tensor]] = {}

    def _draft(self, seq: "EngineSequence", count: int) -> list[int]:
        # it imports the engine: not at module level
        from servelab.optimizations.speculative import KVSession

        session = self.sessions.get(seq.seq_id)
        if session is None:
            session = self.sessions[seq.seq_id] = KVSession(self.model, self.max_model_len)
        tokens = seq.token_ids
        session.rollback(_common_prefix(session.tokens, tokens, len(tokens) - 1))
        feed, drafts, probs = tokens[session.length:], [], []
        for _ in range(count):
            logits = session.extend(feed, 1)
            mask = (None if seq.params.grammar is None  # the grammar's mask after the drafts so far
                    else structured.verify_masks(seq, tuple(drafts), logits.shape[-1])[-1])
            q, dead = next_token_probs(
                logits,
                [
                    SamplingRow(
                        seq.params, seq.prompt_ids, seq.output_ids + drafts, seq.generator, mask
                    )
                ],
            )
            if dead:
                break
            if seq.params.temperature > 0:  # drawn from q with the sequence's own generator
                uniform = torch.rand((1,), generator=seq.generator, dtype=torch.float64).to(
                    q.device
                )
                drafts.append(int(draw(q, uniform)[0]))
            else:
                drafts.append(int(q[0].argmax()))
            probs.append(q[0])
            feed = drafts[-1:]
        self._probs[seq.seq_id] = probs
        return drafts

    def draft_probs(
        self, seq: "EngineSequence", drafts: tuple[int, ...]
    ) -> list[torch.Tensor] | None:
        return self._probs.pop(seq.seq_id)[:len(drafts)]

    def keep_only(self, seq_ids: set[str]) -> None:
        for seq_id in [s for s in self.sessions if s not in seq_ids]:
            del self.sessions[seq_id]
            self._probs.pop(seq_id, None)


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])


def make_proposer(config: SpeculativeConfig | None, target: LlamaForCausalLM,
                  max_model_len: int) -> Proposer | None:
    """The proposer of ``config`` for ``target`` (None: no speculation). A draft model is loaded
    here (a checkpoint folder, or the shipped tiny draft model for ``"model": None``) onto the
    target's device and dtype; ValueError when its vocabulary differs from the target's."""
    if config is None:
        return None
    if config.method == "ngram":
        return NgramProposer(config, max_model_len)
    weight = target.model.embed_tokens.weight
    draft = config.model
    if not isinstance(draft, LlamaForCausalLM):
        from servelab.model import draft_model_dir, load_checkpoint
        from servelab.model.pretrained import resolve_checkpoint

        where = draft_model_dir() if draft is None else resolve_checkpoint(draft)
        draft = load_checkpoint(where, device=weight.device, dtype=weight.dtype)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"speculative_config['model'] must share the target's tokenizer: its vocabulary has "
            f"{draft.config.vocab_size} tokens, the target's {target.config.vocab_size}"
        )
    return DraftModelProposer(
        config, draft.to(device=weight.device, dtype=weight.dtype).eval(), max_model_len
    )
