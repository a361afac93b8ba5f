"""Log-probabilities: the raw model's ``log_softmax`` of the logits rows a step already computed.

Before any processor (vLLM's default ``raw_logprobs``), in float64: the engine reads them from the
step that sampled the token (``params.logprobs``) and, for prompt tokens, from the prefill that
computed them (``params.prompt_logprobs``), never from a second forward pass. Only requests that ask
for them run this.

System boundary: logits ``[rows, vocab]`` (any device) in, Python floats out; natural logarithms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch

from servelab.sampling.params import SamplingParams

__all__ = [
    "TokenLogprob",
    "SampleLogprobs",
    "Scored",
    "token_logprobs",
    "record_sampled",
    "ScoreRow",
    "score_rows",
    "score_prompts",
    "take_logprobs",
    "take_prompt_logprobs",
]


@dataclass(frozen=True)
class TokenLogprob:
    """One token's raw log-probability (natural log) and the ``k`` most likely tokens at its
    position."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass
class SampleLogprobs:
    """One sample's logprobs so far and how many were handed out (empty unless its request asks)."""

    generated: list[TokenLogprob] = field(default_factory=list)  # one per generated token
    sent: int = 0
    prompt: list[TokenLogprob] = field(default_factory=list)  # prompt token i + 1 at index i
    prompt_sent: bool = False


class Scored(Protocol):
    """What this module reads and writes of one sample (the ``EngineSequence`` provides it)."""

    params: SamplingParams
    prompt_ids: list[int]
    emitted_ids: list[int]  # the generated ids that have reached the caller
    finish_reason: str | None  # why the sample ended; None while it runs
    logprobs: SampleLogprobs


def token_logprobs(
    logits: torch.Tensor, targets: Sequence[int], top_k: Sequence[int]
) -> list[TokenLogprob]:
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


def record_sampled(
    logits: torch.Tensor, seqs: Sequence[Scored], tokens: Sequence[int | None]
) -> None:
    """Append to each sample that asked for ``params.logprobs`` the logprob of the token it just
    drew from its row of ``logits`` (the raw distribution of the same rows)."""
    wanted = [
        i for i, s in enumerate(seqs) if s.params.logprobs is not None and tokens[i] is not None
    ]
    if not wanted:
        return
    found = token_logprobs(
        logits[torch.tensor(wanted, device=logits.device)],
        [tokens[i] for i in wanted],
        [seqs[i].params.logprobs for i in wanted],
    )
    for i, logprob in zip(wanted, found):
        seqs[i].logprobs.generated.append(logprob)


class ScoreRow(NamedTuple):
    """A prompt position whose logits score the next prompt token: flat ``index`` in the step's
    batch."""

    index: int
    seq: Scored
    position: int


def score_rows(seq: Scored, start: int, end: int, offset: int) -> list[ScoreRow]:
    """The score rows of a chunk computing positions ``[start, end)`` of ``seq`` from flat index
    ``offset`` (the last prompt position is not one: its logits are the sampled row)."""
    return [
        ScoreRow(offset + p - start, seq, p)
        for p in range(start, min(end, len(seq.prompt_ids) - 1))
    ]


def score_prompts(rows: Sequence[ScoreRow], logits: torch.Tensor) -> None:
    """Store the prompt logprobs of a step's score rows (row ``i`` of ``logits`` scoring prompt
    token ``rows[i].position + 1``); a position scored before (a recomputed prefill) is skipped."""
    found = token_logprobs(logits, [row.seq.prompt_ids[row.position + 1] for row in rows],
                           [row.seq.params.prompt_logprobs for row in rows])
    for (_, seq, position), logprob in zip(rows, found):
        if position == len(seq.logprobs.prompt):
            seq.logprobs.prompt.append(logprob)


def take_logprobs(seq: Scored) -> tuple[TokenLogprob, ...]:
    """The logprobs of the ids released since the last output, and of a final EOS (never
    released)."""
    state = seq.logprobs
    end = (
        len(state.generated)
        if seq.finish_reason == "eos"
        else min(len(seq.emitted_ids), len(state.generated))
    )
    new = tuple(state.generated[state.sent:end])
    state.sent = max(state.sent, end)
    return new


def take_prompt_logprobs(seq: Scored) -> tuple[TokenLogprob, ...] | None:
    """The prompt's logprobs once all are computed, handed out once (None before, after, or
    unasked)."""
    state = seq.logprobs
    if (
        seq.params.prompt_logprobs is None
        or state.prompt_sent
        or len(state.prompt) < len(seq.prompt_ids) - 1
    ):
        return None
    state.prompt_sent = True
    return tuple(state.prompt)
