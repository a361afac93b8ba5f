"""One sample of a request inside the engine: its record, its text, and the step's outputs built
from it.

A request with ``n`` samples has ``n`` sequences (``EngineSequence.request`` points back to its
:class:`EngineRequest`, defined here too: the two records refer to each other), shared by the
scheduler, the model runner and output processing. Counts are tokens: ``num_computed`` leading
tokens have K/V in the cache; ``emitted_ids`` have reached the caller as text. Phase 5 of a step is
:func:`accept_token` per sampled token, :func:`finish_text` when a sample ends,
:func:`request_output`.

System boundary: plain bookkeeping, no tensors but the sample's generator; times are the engine
clock's seconds. It frees nothing (the engine's one terminal path does).
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from servelab.engine.logprobs import (
    SampleLogprobs,
    TokenLogprob,
    take_logprobs,
    take_prompt_logprobs,
)
from servelab.lifecycle.ledger import Usage
from servelab.metrics.latency import RequestTiming
from servelab.sampling.params import SamplingParams
from servelab.sampling.stop_strings import StopStringBuffer


class SeqStatus(enum.Enum):
    """Where the scheduler holds a sequence."""

    WAITING = "waiting"  # queued for (re)admission; holds no KV blocks
    RUNNING = "running"  # holds KV blocks in the device pool
    SWAPPED = "swapped"  # its KV lives in host memory; holds no device blocks
    FINISHED = "finished"  # reclaimed; holds nothing


@dataclass
class SequenceTimes:
    """Timestamps in seconds from the engine's clock (one boundary: the engine's API)."""

    arrival: float
    first_scheduled: float | None = None
    emits: list[float] = field(default_factory=list)  # one per token id handed to the client
    finish: float | None = None


@dataclass(eq=False)
class EngineSequence:
    """One sample of a request: what the scheduler, the model runner and output processing share."""

    seq_id: str
    request: EngineRequest
    index: int  # which of the request's n samples (sample i is seeded with seed + i)
    prompt_ids: list[int]
    params: SamplingParams
    arrival_index: int  # tie-breaker that makes queue order total and deterministic
    times: SequenceTimes
    generator: torch.Generator
    detok: "IncrementalDetokenizer"
    stops: StopStringBuffer
    namespace: str = ""
    priority: int = 0
    tenant: str = ""  # who sent it: the "fair-queuing" policy shares tokens between tenants
    # the scheduler tick it was queued at; ``waited`` = ticks since then ("sjf-aging")
    queued_tick: int = 0
    waited: int = 0
    deadline: float | None = None  # absolute time on the engine's clock
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    cached_prompt_tokens: int | None = None  # set at first admission
    status: SeqStatus = SeqStatus.WAITING
    # descheduled by the caller: every tick skips it; it keeps whatever it holds
    paused: bool = False
    # sibling sequences it forks into once its prompt is computed (n - 1 for a request with n
    # samples, 0 after the fork); it holds a batch slot for each of them in advance
    samples_to_fork: int = 0
    # the text side: what the caller has been sent and what waits
    text: str = ""
    # decoded text length after each generated token
    token_ends: list[int] = field(default_factory=list)
    emitted_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    committed_at_end: int = 0  # num_computed when it finished (what it held just before release)
    delta: str = ""  # text produced since the last output, not yet handed out
    delta_ids: tuple[int, ...] = ()  # ids released since the last output
    # params.logprobs / prompt_logprobs
    logprobs: SampleLogprobs = field(default_factory=SampleLogprobs)
    # the sample's xgrammar matcher (params.grammar), made at its first step
    matcher: object | None = None

    @property
    def token_ids(self) -> list[int]:
        """Prompt ids followed by the generated ids."""
        return self.prompt_ids + self.output_ids

    def tokens_between(self, start: int, end: int) -> list[int]:
        """``token_ids[start:end]`` without building the whole list (a decode step reads one
        token)."""
        split = len(self.prompt_ids)
        if start >= split:
            return self.output_ids[start - split:end - split]
        if end <= split:
            return self.prompt_ids[start:end]
        return self.prompt_ids[start:] + self.output_ids[:end - split]

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        """Tokens still to run through the model before the next sample (1 in steady decode)."""
        return self.num_tokens - self.num_computed

    @property
    def batch_slots(self) -> int:
        """Batch slots it takes while running: its own plus one per sibling it will still fork
        into."""
        return 1 + self.samples_to_fork

    @property
    def remaining_tokens(self) -> int:
        """Tokens it may still generate under ``max_tokens``."""
        return self.params.max_tokens - len(self.output_ids)


@dataclass(eq=False)
class EngineRequest:
    """One request: its samples' sequences. Before the fork only ``seqs[0]`` is scheduled; it holds
    a batch slot for every sibling. ``seqs`` is emptied when the request ends (``LLMEngine._end``),
    so the request and its sequences do not keep each other alive."""

    request_id: str
    seqs: list[EngineSequence] = field(default_factory=list)
    forked: bool = False
    finish_reason: str | None = None

    @property
    def seq(self) -> EngineSequence:
        """Sample 0's sequence: the one scheduled before the fork, the only one when n == 1."""
        return self.seqs[0]


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, decoding only a short window each time. A
    UTF-8 character split over several tokens decodes to a trailing U+FFFD until the rest arrives:
    that tail is held back. Decoding ``ids[_prefix:]`` and dropping the text of
    ``ids[_prefix:_read]`` gives exactly the new text, at a cost independent of the output
    length."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.text = ""  # all text returned so far
        self._prefix = 0  # window start: context for the tokens not yet returned
        self._read = 0  # ids before this index have had their text returned

    def update(self, token_ids: list[int], final: bool = False) -> str:
        """New text for ``token_ids`` (all generated ids so far); ``final`` releases a held tail."""
        seen = self.tokenizer.decode(token_ids[self._prefix:self._read])
        window = self.tokenizer.decode(token_ids[self._prefix:])
        if (window.endswith("\ufffd") and not final) or len(window) <= len(seen):
            return ""
        delta = window[len(seen):]
        self._prefix, self._read = self._read, len(token_ids)
        self.text += delta
        return delta


@dataclass(frozen=True)
class SampleOutput:
    """One of the ``n`` samples of a parallel-sampling request: this step's delta plus its
    totals."""

    index: int  # 0 .. n-1; sample i was drawn with seed + i when the request had a seed
    delta: str
    text: str
    delta_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token of this step's delta (EOS included)


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request: the new text and ids, plus the totals so far. With
    ``params.n > 1``, ``samples`` holds all ``n`` (else empty) and the text and id fields mirror
    sample 0.
    ``finish_reason`` (once every sample finished): cancelled / timed_out / failed when cut short,
    else that of the sample that finished last. ``usage`` sums over the samples; ``timing`` is per
    stream (n == 1 only). ``logprobs``: one per id handed out this step, plus a final EOS
    (``params.logprobs``);
    ``prompt_logprobs``: the prompt tokens after the first, once, when the prompt is done (else
    None)."""

    request_id: str
    delta: str
    text: str
    delta_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    usage: Usage
    timing: RequestTiming | None  # set once finished, when at least one token was emitted
    samples: tuple[SampleOutput, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True)
class StepOutputs:
    """What one :meth:`~servelab.engine.LLMEngine.step` returns.

    Attributes:
        outputs: one :class:`RequestOutput` per request that produced text or ended this step
            (requests ended between steps included).
        admitted: ids of the requests admitted this step (readmissions included), in batch order.
        num_preempted: sequences preempted this step, by recompute or swap.
        num_batched_tokens: tokens the step's forward pass computed (0: no forward pass).
    """

    outputs: list[RequestOutput] = field(default_factory=list)
    admitted: tuple[str, ...] = ()
    num_preempted: int = 0
    num_batched_tokens: int = 0


def accept_token(seq: EngineSequence, token: int | None, now: float, eos: Collection[int],
                 max_model_len: int) -> tuple[str | None, str]:
    """Append a sampled token and produce its text. Returns the stop it fired (None, ``"eos"`` (one
    of the ``eos`` ids), ``"stop"``, ``"length"`` or ``"failed"``) and, for ``"failed"``, why."""
    if token is None:
        return "failed", "the hard constraints mask every token"
    seq.output_ids.append(token)
    if token in eos and not seq.params.ignore_eos:
        return "eos", ""
    try:
        delta = seq.stops.push(seq.detok.update(seq.output_ids))
    # e.g. the tokenizer cannot decode: this request fails, the others go on
    except Exception as exc:
        return "failed", repr(exc)
    seq.token_ends.append(len(seq.detok.text))
    seq.text += delta
    seq.delta += delta
    if seq.stops.finished:
        return "stop", ""
    if len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= max_model_len:
        return "length", ""
    seq.delta_ids += release_ids(seq, now)
    return None, ""


def release_ids(seq: EngineSequence, now: float, partial: bool = False) -> tuple[int, ...]:
    """Hand out the token ids whose text has reached the caller (``partial``: also those cut by a
    stop string), stamping their emit time. An id whose text is still held back waits with it."""
    released, new = len(seq.text), []
    while len(seq.emitted_ids) < len(seq.token_ends):
        i = len(seq.emitted_ids)
        start = seq.token_ends[i - 1] if i else 0
        if not (seq.token_ends[i] <= released or (partial and start < released)):
            break
        seq.emitted_ids.append(seq.output_ids[i])
        seq.times.emits.append(now)
        new.append(seq.output_ids[i])
    return tuple(new)


def finish_text(seq: EngineSequence, reason: str, now: float) -> None:
    """Finish one sample's text: a normal end (length, EOS) releases the text held back for a
    possible stop string; a stop match releases the ids of tokens its text reaches into; cancelled,
    timed-out and failed samples drop whatever was still held (the client never sees it)."""
    if reason in ("length", "eos"):
        tail = seq.stops.push(seq.detok.update(seq.output_ids[:len(seq.token_ends)], final=True))
        tail += seq.stops.flush()
        seq.text += tail
        seq.delta += tail
        seq.token_ends = [min(end, len(seq.text)) for end in seq.token_ends]
    if reason in ("length", "eos", "stop"):
        seq.delta_ids += release_ids(seq, now, partial=reason == "stop")
    seq.finish_reason = reason
    seq.committed_at_end = seq.num_computed
    seq.times.finish = now


def request_output(
    request_id: str, seqs: list[EngineSequence], finish_reason: str | None
) -> RequestOutput:
    """The request's output for this step; hands out (and clears) each sample's pending delta."""
    finished = finish_reason is not None
    first = seqs[0]
    logprobs = [take_logprobs(s) if s.params.logprobs is not None else () for s in seqs]
    samples = tuple(SampleOutput(s.index, s.delta, s.text, s.delta_ids, tuple(s.emitted_ids),
                                 s.finish_reason is not None, s.finish_reason, lp)
                    for s, lp in zip(seqs, logprobs)) if len(seqs) > 1 else ()
    output = RequestOutput(
        request_id=request_id,
        delta=first.delta,
        text=first.text,
        delta_token_ids=first.delta_ids,
        token_ids=tuple(first.emitted_ids),
        finished=finished,
        finish_reason=finish_reason,
        usage=usage(seqs),
        timing=timing(first) if finished and not samples else None,
        samples=samples,
        logprobs=logprobs[0],
        prompt_logprobs=take_prompt_logprobs(first),
    )
    for seq in seqs:
        seq.delta, seq.delta_ids = "", ()
    return output


def usage(seqs: list[EngineSequence]) -> Usage:
    """The request's token counts so far, summed over its samples (a finished sample counts what it
    held when it finished)."""
    first = seqs[0]
    return Usage(
        prompt_tokens=len(first.prompt_ids),
        cached_prompt_tokens=first.cached_prompt_tokens or 0,
        generated_tokens=sum(len(s.output_ids) for s in seqs),
        emitted_tokens=sum(len(s.emitted_ids) for s in seqs),
        committed_tokens=sum(
            s.committed_at_end if s.finish_reason is not None else s.num_computed for s in seqs
        ),
    )


def timing(seq: EngineSequence) -> RequestTiming | None:
    """The stream's ``RequestTiming`` (arrival, first scheduled, emits, finish), None if nothing was
    emitted."""
    times = seq.times
    if not times.emits or times.first_scheduled is None:
        return None
    return RequestTiming(
        arrival=times.arrival,
        first_scheduled=times.first_scheduled,
        emit_times=tuple(times.emits),
        finish=times.finish,
        prompt_tokens=len(seq.prompt_ids),
    )
