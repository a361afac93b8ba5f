"""Speculative decoding: the exact accept/correct rule, and a draft-then-verify decoder with a KV
cache.

*The rule* (pure NumPy, one position at a time). A cheap draft model proposes token ``x`` drawn from
its distribution ``q``; the target model's distribution at the same position is ``p``. Keep ``x``
with probability ``min(1, p(x) / q(x))``. On rejection, draw the replacement from the residual
``norm(max(0, p - q))``. If all ``k`` drafted tokens of a cycle survive, the target's distribution
at the position after them gives one more ("bonus") token for free. Whatever ``q`` is, every emitted
token is distributed exactly as ``p`` (:func:`output_distribution` computes the marginal by
enumeration). ``p`` and ``q`` must be the distributions *after* the request's sampling transforms
(temperature, filters, penalties): at temperature 0 both are one-hot and the rule reduces to "keep
the draft token while it equals the target's argmax", so the output is the target's greedy output.

*The decoder* (:func:`speculative_generate`) runs a real target with one of two proposers: a draft
:class:`~servelab.model.LlamaForCausalLM`, or :class:`PromptLookupProposer` (prompt-lookup, or
n-gram,
drafting: no second model; the drafts are the tokens that followed the latest earlier occurrence of
the sequence's last n-gram). A deterministic proposer drafts from a one-hot ``q``, so the same rule
applies unchanged: keep ``x`` with probability ``p(x)``, otherwise draw from ``p`` with ``x``
removed and renormalised. Each model keeps one sequence's K/V in a :class:`KVSession`, a
single-sequence user of the engine's paged pool and paged attention backend
(``servelab.engine.model_runner``), so there is no second attention implementation here. Per cycle
the bookkeeping keeps three counts apart, as a serving scheduler must:

* *verified*: drafted tokens the target scored (``k`` per cycle, fewer near ``max_new_tokens`` or
  when the n-gram proposer finds fewer);
* *emitted*: tokens appended to the output (accepted drafts plus one correction or bonus token);
* *KV increment*: K/V entries written by the verify pass, split into *committed* (kept: they belong
  to emitted tokens) and *rolled back* (written for rejected drafts, then discarded by moving the
  sequence's length back; the slots are overwritten later and never attended to).

System boundary: token ids in, token ids and per-cycle records out, for one request on one device.
No batching across requests, no scheduler; randomness comes only from the ``numpy.random.Generator``
handed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from servelab._validate import require_int
from servelab.engine.model_runner import KVCache, PagedAttention, build_metadata
from servelab.model.llama import LlamaForCausalLM
from servelab.sampling import SamplingParams, next_token_distribution, sample
from servelab.sampling.reference import _check_probs

__all__ = [
    "CycleRecord",
    "KVSession",
    "PromptLookupProposer",
    "SpeculativeResult",
    "Verdict",
    "acceptance_probability",
    "autoregressive_generate",
    "output_distribution",
    "residual_distribution",
    "speculative_generate",
    "verify_draft",
]


# --------------------------------------------------------------------------------------------------
# The accept/correct rule
# --------------------------------------------------------------------------------------------------


def _pair(
    p: Sequence[float] | np.ndarray, q: Sequence[float] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Validate a target/draft pair of probability vectors over the same vocabulary."""
    p, q = _check_probs(p, "p"), _check_probs(q, "q")
    if p.size != q.size:
        raise ValueError(
            f"q has {q.size} entries but p has {p.size}: target and draft must share a vocabulary"
        )
    return p, q


def acceptance_probability(p: Sequence[float] | np.ndarray, q: Sequence[float] | np.ndarray,
                           token: int) -> float:
    """``min(1, p[token] / q[token])``: the chance a drafted ``token`` (drawn from ``q``) is
    kept."""
    p, q = _pair(p, q)
    if (
        isinstance(token, bool)
        or not isinstance(token, (int, np.integer))
        or not 0 <= token < p.size
    ):
        raise ValueError(f"token must be an int id in [0, {p.size - 1}], got {token!r}")
    if q[token] <= 0:
        raise ValueError(
            f"token {token} has draft probability q[token] = 0, so it cannot have been "
            f"drafted from q"
        )
    return float(min(1.0, p[token] / q[token]))


def residual_distribution(
    p: Sequence[float] | np.ndarray, q: Sequence[float] | np.ndarray
) -> np.ndarray:
    """``norm(max(0, p - q))``: where a rejected draft's replacement is drawn from.

    It puts mass exactly where the target wants more than the draft offered. When ``p == q`` the
    residual is empty; rejection then has probability 0, and ``p`` is returned so the function is
    total.
    """
    p, q = _pair(p, q)
    excess = np.maximum(p - q, 0.0)
    total = excess.sum()
    return p if total <= 0 else excess / total


def output_distribution(
    p: Sequence[float] | np.ndarray, q: Sequence[float] | np.ndarray
) -> np.ndarray:
    """The exact marginal of one accept/correct step, by enumerating every draft token and branch.

    ``P(out = y) = q(y) * min(1, p(y)/q(y)) + P(reject) * residual(y)``, with ``P(reject) = sum_x
    q(x) * (1 - min(1, p(x)/q(x)))``. It equals ``p`` up to float rounding, for any ``q`` over the
    same vocabulary: this is the statement that speculative sampling is lossless.
    """
    p, q = _pair(p, q)
    keep = np.where(q > 0, np.minimum(1.0, np.divide(p, q, out=np.zeros_like(p), where=q > 0)), 0.0)
    accepted = q * keep
    return accepted + (1.0 - accepted.sum()) * residual_distribution(p, q)


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one cycle's drafts: ``tokens`` = the accepted drafts followed by one
    correction (after a rejection) or one bonus token (when every draft was accepted)."""

    accepted: int
    tokens: tuple[int, ...]
    bonus: bool


def verify_draft(target_probs: Sequence[np.ndarray], draft_probs: Sequence[np.ndarray],
                 draft_tokens: Sequence[int], rng: np.random.Generator) -> Verdict:
    """Apply the accept/correct rule left to right to ``k`` drafted tokens.

    ``target_probs`` holds ``k + 1`` distributions (the target after each prefix of the draft, the
    last one after all ``k`` drafts); ``draft_probs`` the ``k`` distributions the drafts were drawn
    from. One uniform is drawn per examined draft, and one :func:`~servelab.sampling.sample` call
    makes the correction or bonus token.
    """
    k = len(draft_tokens)
    if k < 1:
        raise ValueError(f"draft_tokens must hold k >= 1 tokens, got {k}")
    if len(draft_probs) != k or len(target_probs) != k + 1:
        raise ValueError(f"need k = {k} draft_probs and k + 1 = {k + 1} target_probs, got "
                         f"{len(draft_probs)} and {len(target_probs)}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    kept: list[int] = []
    for p, q, token in zip(target_probs, draft_probs, draft_tokens):
        if rng.random() < acceptance_probability(p, q, token):
            kept.append(int(token))
            continue
        kept.append(sample(residual_distribution(p, q), rng))
        return Verdict(len(kept) - 1, tuple(kept), bonus=False)
    kept.append(sample(_check_probs(target_probs[k], f"target_probs[{k}]"), rng))
    return Verdict(k, tuple(kept), bonus=True)


# --------------------------------------------------------------------------------------------------
# One sequence's KV cache with rollback, on the engine's paged backend
# --------------------------------------------------------------------------------------------------


class KVSession:
    """One sequence's K/V for one model, kept in a private paged block pool of ``capacity_tokens``
    slots.

    The block table is simply blocks ``0, 1, 2, ...``. :attr:`length` counts the positions whose K/V
    is committed; :meth:`extend` writes new positions after it and :meth:`rollback` moves it back.
    Rolled- back slots still hold stale K/V, but attention masks every key at or beyond a query's
    own position, and the next :meth:`extend` overwrites them.

    With ``reuse_cache=False`` the session models decoding *without* a KV cache: every
    :meth:`extend` recomputes all committed positions before the new ones (same logits, the cost of
    the full-recompute loop). The bookkeeping (:attr:`length`, :meth:`rollback`) is unchanged.
    """

    def __init__(self, model: LlamaForCausalLM, capacity_tokens: int, block_size: int = 16,
                 reuse_cache: bool = True) -> None:
        if not isinstance(model, LlamaForCausalLM):
            raise TypeError(f"model must be a LlamaForCausalLM, got {type(model).__name__}")
        if (
            isinstance(capacity_tokens, bool)
            or not isinstance(capacity_tokens, int)
            or capacity_tokens < 1
        ):
            raise ValueError(f"capacity_tokens must be an int >= 1, got {capacity_tokens!r}")
        cfg = model.config
        weight = model.model.embed_tokens.weight
        self.model, self.device, self.dtype, self.block_size = (
            model,
            weight.device,
            weight.dtype,
            block_size,
        )
        num_blocks = -(-capacity_tokens // block_size)
        self.cache = KVCache(cfg.num_hidden_layers, num_blocks, block_size, cfg.num_key_value_heads,
                             cfg.head_dim, weight.dtype, weight.device)
        self.backend = PagedAttention(self.cache)
        self.capacity = num_blocks * block_size
        self.reuse_cache = reuse_cache
        self.tokens: list[int] = []  # token id at each committed position

    @torch.inference_mode()
    def extend(self, token_ids: Sequence[int], n_logits: int) -> torch.Tensor:
        """Append ``token_ids`` at positions ``length ..``; float32 logits ``[n_logits, vocab]`` of
        the last ``n_logits`` of them (row ``i`` predicts the token after that position)."""
        count = len(token_ids)
        if count < 1:
            raise ValueError("token_ids must hold at least one token")
        if not 1 <= n_logits <= count:
            raise ValueError(f"n_logits must be in [1, {count}], got {n_logits}")
        if self.length + count > self.capacity:
            raise ValueError(
                f"extending {self.length} cached tokens by {count} exceeds capacity {self.capacity}"
            )
        feed = self.tokens + [int(t) for t in token_ids]
        start = self.length if self.reuse_cache else 0
        end = len(feed)
        table = list(range(-(-end // self.block_size)))
        self.backend.metadata = build_metadata(
            [(start, end - start, table)], self.block_size, self.device, self.dtype
        )
        try:
            ids = torch.tensor(feed[start:], device=self.device)
            positions = torch.arange(start, end, device=self.device)
            hidden = self.model.hidden_states(ids, positions, self.backend)
        finally:
            self.backend.metadata = None
        self.tokens = feed
        return self.model.lm_head(hidden[end - start - n_logits:]).float()

    @property
    def length(self) -> int:
        """Committed positions: K/V computed and kept."""
        return len(self.tokens)

    def rollback(self, length: int) -> int:
        """Discard every position at or after ``length``; returns how many entries were dropped."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length must be in [0, {self.length}], got {length}")
        dropped = self.length - length
        del self.tokens[length:]
        return dropped

    def cached_keys(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s committed keys, ``[length, kv_heads, head_dim]`` (for checks and
        figures)."""
        return self.cache.k[layer].flatten(1, 2)[:, : self.length].transpose(0, 1).clone()


# --------------------------------------------------------------------------------------------------
# Prompt-lookup (n-gram) drafting
# --------------------------------------------------------------------------------------------------


class PromptLookupProposer:
    """Draft by copying: find the sequence's last ``n``-gram earlier in the sequence (prompt and
    output so far) and propose the tokens that followed it there.

    ``n`` runs from ``max_ngram`` down to ``min_ngram``; the first ``n`` with an earlier occurrence
    wins, and of its occurrences the latest one. No match proposes nothing, and the cycle is a plain
    decode step. It costs no forward pass and keeps no K/V: on text that repeats itself (code edits,
    quoting the prompt, a model stuck in a loop) it drafts well, elsewhere it mostly proposes
    nothing.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.min_ngram = require_int("min_ngram", min_ngram, minimum=1)
        self.max_ngram = require_int("max_ngram", max_ngram, minimum=min_ngram)

    def propose(self, sequence: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` drafted token ids after ``sequence`` (possibly none)."""
        require_int("k", k, minimum=0)
        tokens = list(sequence)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            tail = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):  # latest earlier occurrence first
                if tokens[start:start + n] == tail:
                    return tokens[start + n:start + n + k]
        return []


def _one_hot(token: int, size: int) -> np.ndarray:
    q = np.zeros(size)
    q[token] = 1.0
    return q


# --------------------------------------------------------------------------------------------------
# Decoders
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CycleRecord:
    """Bookkeeping of one draft-then-verify cycle (all counts are tokens or K/V entries per model).

    ``verified`` drafts were scored by the target, ``accepted`` of them kept, ``emitted`` tokens
    added to the output. The target wrote ``target_kv_written`` K/V entries (catch-up tokens plus
    drafts), of which ``target_kv_rolled_back`` were discarded; the draft model likewise.
    """

    verified: int
    accepted: int
    emitted: int
    target_kv_written: int
    target_kv_rolled_back: int
    draft_kv_written: int
    draft_kv_rolled_back: int

    @property
    def target_kv_committed(self) -> int:
        """Target K/V entries kept at the end of the cycle."""
        return self.target_kv_written - self.target_kv_rolled_back


@dataclass
class SpeculativeResult:
    """Generated token ids and one :class:`CycleRecord` per target verify pass."""

    tokens: list[int] = field(default_factory=list)
    cycles: list[CycleRecord] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over *examined* drafts (NaN when none was examined).

        A cycle tests its drafts left to right and stops at the first rejection, so the drafts after
        it are scored by the target but never tested. Examined = accepted + one per cycle that
        rejected. This is the per-draft acceptance probability that
        ``servelab.metrics.capacity.expected_tokens_per_cycle`` takes.
        """
        accepted = sum(c.accepted for c in self.cycles)
        examined = accepted + sum(c.accepted < c.verified for c in self.cycles)
        return accepted / examined if examined else float("nan")

    @property
    def tokens_per_cycle(self) -> float:
        """Mean emitted tokens per target pass: what one verify pass buys."""
        return len(self.tokens) / len(self.cycles)


def _check_request(prompt_ids: Sequence[int], max_new_tokens: int, params: SamplingParams,
                   rng: np.random.Generator, vocab_size: int) -> list[int]:
    if isinstance(prompt_ids, (str, bytes)) or len(prompt_ids) < 1:
        raise ValueError("prompt_ids must be a non-empty sequence of token ids")
    bad = [t for t in prompt_ids if isinstance(t, bool) or not isinstance(t, (int, np.integer))
           or not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt_ids must be int ids in [0, {vocab_size - 1}], got {bad[:3]}")
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 1
    ):
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return [int(t) for t in prompt_ids]


def _session(model: LlamaForCausalLM, name: str, positions: int, reuse_cache: bool) -> KVSession:
    limit = model.config.max_position_embeddings
    if positions > limit:
        raise ValueError(f"prompt plus max_new_tokens needs {positions} positions, "
                         f"more than {name}'s max_position_embeddings = {limit}")
    return KVSession(model, positions, reuse_cache=reuse_cache)


def _distribution(
    logits: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int]
) -> np.ndarray:
    return next_token_distribution(logits.cpu().numpy(), params, prompt, output)


def autoregressive_generate(
    model: LlamaForCausalLM,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    rng: np.random.Generator,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    reuse_cache: bool = True,
) -> list[int]:
    """The baseline: one forward pass and one sampling step per token (same session and sampler as
    :func:`speculative_generate`, so timings compare like with like). ``reuse_cache=False``
    recomputes the whole sequence at every step, as if there were no KV cache."""
    if not isinstance(model, LlamaForCausalLM):
        raise TypeError(f"model must be a LlamaForCausalLM, got {type(model).__name__}")
    prompt = _check_request(prompt_ids, max_new_tokens, params, rng, model.config.vocab_size)
    session = _session(model, "model", len(prompt) + max_new_tokens, reuse_cache)
    out: list[int] = []
    feed = prompt
    while len(out) < max_new_tokens:
        logits = session.extend(feed, 1)[0]
        token = sample(_distribution(logits, params, prompt, out), rng)
        out.append(token)
        if token == eos_token_id:
            break
        feed = [token]
    return out


def _draft(
    session: KVSession,
    sequence: list[int],
    k: int,
    params: SamplingParams,
    prompt: list[int],
    out: list[int],
    rng: np.random.Generator,
) -> tuple[list[int], list[np.ndarray], int]:
    """Run the draft ``k`` times; returns drafted tokens, their distributions and K/V entries
    written."""
    start = session.length
    feed = sequence[start:]
    tokens: list[int] = []
    probs: list[np.ndarray] = []
    for _ in range(k):
        q = _distribution(session.extend(feed, 1)[0], params, prompt, out + tokens)
        tokens.append(sample(q, rng))
        probs.append(q)
        feed = [tokens[-1]]
    return tokens, probs, session.length - start


def _check_pair(target: LlamaForCausalLM, draft: LlamaForCausalLM | PromptLookupProposer) -> None:
    if not isinstance(target, LlamaForCausalLM):
        raise TypeError(f"target must be a LlamaForCausalLM, got {type(target).__name__}")
    if isinstance(draft, PromptLookupProposer):
        return
    if not isinstance(draft, LlamaForCausalLM):
        raise TypeError(
            f"draft must be a LlamaForCausalLM or a PromptLookupProposer, got "
            f"{type(draft).__name__}"
        )
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(
            f"draft vocabulary ({draft.config.vocab_size}) differs from the target's "
            f"({target.config.vocab_size}): the draft must share the target's tokenizer"
        )


def _propose(
    draft: LlamaForCausalLM | PromptLookupProposer,
    draft_kv: KVSession | None,
    sequence: list[int],
    k: int,
    params: SamplingParams,
    prompt: list[int],
    out: list[int],
    rng: np.random.Generator,
    vocab_size: int,
) -> tuple[list[int], list[np.ndarray], int]:
    """Up to ``k`` drafts, the distributions they were drawn from, and the draft K/V entries
    written."""
    if k == 0:
        return [], [], 0
    if draft_kv is None:  # a deterministic proposer drafts from a one-hot q
        tokens = draft.propose(sequence, k)
        return tokens, [_one_hot(t, vocab_size) for t in tokens], 0
    return _draft(draft_kv, sequence, k, params, prompt, out, rng)


def speculative_generate(
    target: LlamaForCausalLM,
    draft: LlamaForCausalLM | PromptLookupProposer,
    prompt_ids: Sequence[int],
    k: int,
    params: SamplingParams,
    rng: np.random.Generator,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    reuse_cache: bool = True,
) -> SpeculativeResult:
    """Generate up to ``max_new_tokens`` tokens, at most ``k`` drafted tokens per target verify
    pass.

    ``draft`` is a draft model sharing the target's tokenizer, or a :class:`PromptLookupProposer`.
    Every emitted token is distributed as the target's
    :func:`~servelab.sampling.next_token_distribution` under ``params``; with ``temperature=0`` the
    output equals the target's greedy output. Generation stops after ``eos_token_id`` (included) or
    ``max_new_tokens``. The first verify pass also prefills the prompt into the target; a draft
    model prefills on its first drafting step. ``reuse_cache=False`` makes the models recompute the
    whole sequence at every pass (speculation without a KV cache).
    """
    _check_pair(target, draft)
    prompt = _check_request(prompt_ids, max_new_tokens, params, rng, target.config.vocab_size)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (the draft length) must be an int >= 1, got {k!r}")
    # a verify pass never runs past the last position to emit: k shrinks near max_new_tokens
    positions = len(prompt) + max_new_tokens
    target_kv = _session(target, "target", positions, reuse_cache)
    draft_kv = (
        None
        if isinstance(draft, PromptLookupProposer)
        else _session(draft, "draft", positions, reuse_cache)
    )
    result = SpeculativeResult()
    sequence = list(prompt)
    while len(result.tokens) < max_new_tokens:
        n = len(sequence)
        k_cycle = min(k, max_new_tokens - len(result.tokens) - 1)
        drafts, q_rows, draft_written = _propose(
            draft,
            draft_kv,
            sequence,
            k_cycle,
            params,
            prompt,
            result.tokens,
            rng,
            target.config.vocab_size,
        )
        k_cycle = len(drafts)
        catch_up = sequence[target_kv.length:]
        logits = target_kv.extend(catch_up + drafts, k_cycle + 1)
        p_rows = [
            _distribution(logits[i], params, prompt, result.tokens + drafts[:i])
            for i in range(k_cycle + 1)
        ]
        if k_cycle:
            verdict = verify_draft(p_rows, q_rows, drafts, rng)
        else:
            verdict = Verdict(0, (sample(p_rows[0], rng),), bonus=True)
        emitted = list(verdict.tokens)
        if eos_token_id in emitted:
            emitted = emitted[: emitted.index(eos_token_id) + 1]
        emitted = emitted[: max_new_tokens - len(result.tokens)]
        sequence += emitted
        result.tokens += emitted
        # keep K/V only for positions whose token is now part of the sequence (all but the newest)
        target_dropped = target_kv.rollback(len(sequence) - 1)
        draft_dropped = (
            draft_kv.rollback(min(draft_kv.length, n + min(verdict.accepted, len(emitted))))
            if draft_kv is not None
            else 0
        )
        result.cycles.append(CycleRecord(
            verified=k_cycle, accepted=verdict.accepted, emitted=len(emitted),
            target_kv_written=len(catch_up) + k_cycle, target_kv_rolled_back=target_dropped,
            draft_kv_written=draft_written, draft_kv_rolled_back=draft_dropped))
        if emitted[-1] == eos_token_id:
            break
    return result
