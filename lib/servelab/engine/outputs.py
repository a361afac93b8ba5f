"""Output processing: sampled token ids -> text the caller may see, stop decisions, per-step outputs.

For each sampled token of each sample: append it, detokenise incrementally, pass the text through the
stop-string buffer (which holds back a tail that could still start a stop string), check EOS / stop /
length, and hand out the token ids whose text has reached the caller (stamping their emit time). When a
sample ends, :func:`settle` releases or drops what was held back. :func:`request_output` builds the
step's :class:`RequestOutput` and clears the pending deltas.

System boundary: text and token ids of one engine; times are the engine clock's seconds. It frees no
resources (the engine's one terminal path does that through ``servelab.lifecycle.reclaim``).
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field

from servelab.engine.sequence import IncrementalDetokenizer, Sequence
from servelab.metrics import RequestTiming
from servelab.streaming import StopStringBuffer


@dataclass(frozen=True)
class TokenUsage:
    """Token counts of one request (tokens).

    ``generated``: sampled by the engine. ``emitted``: token ids handed to the caller. An id is handed out
    with its text, so one held back as a possible stop-string prefix waits; an EOS token, tokens wholly
    inside or after a matched stop string, and held tokens of a cancelled/timed-out/failed request are
    generated but never emitted. ``committed``: tokens whose KV the cache holds for this request
    (prompt + generated - 1 in steady decode; 0 after preemption by recompute until it is prefilled
    again; at the end, what it held just before reclaim).
    """

    prompt_tokens: int
    cached_prompt_tokens: int
    generated: int
    emitted: int
    committed: int


@dataclass(frozen=True)
class SampleOutput:
    """One of the ``n`` samples of a parallel-sampling request: this step's delta plus its totals."""

    index: int  # 0 .. n-1; sample i was drawn with seed + i when the request had a seed
    delta: str
    text: str
    delta_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request: the new text and ids, plus the totals so far.

    With ``params.n > 1`` the request has ``n`` samples: ``samples`` holds all of them (empty when
    n == 1) and the text and id fields mirror sample 0, so code written for one answer still reads one.
    ``finished`` is True once every sample has finished; ``finish_reason`` is then the request's:
    cancelled / timed_out / failed when it was cut short, else that of the sample that finished last.
    ``usage`` sums ``generated``, ``emitted`` and ``committed`` over the samples. ``timing`` is per
    token stream, so it is only set for n == 1.
    """

    request_id: str
    delta: str
    text: str
    delta_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    usage: TokenUsage
    timing: RequestTiming | None  # set once finished, when at least one token was emitted
    samples: tuple[SampleOutput, ...] = ()


@dataclass(eq=False)
class SampleStream:
    """The text side of one sample (a request has ``n``): what the caller has been sent and what waits.

    ``seq`` is the scheduler's record of the same sample (its tokens and KV progress).
    """

    index: int
    request_id: str
    seq: Sequence
    detok: IncrementalDetokenizer
    stops: StopStringBuffer
    text: str = ""
    token_ends: list[int] = field(default_factory=list)  # decoded text length after each generated token
    emitted_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    committed_at_end: int = 0
    delta: str = ""  # text produced since the last output, not yet handed out
    delta_ids: tuple[int, ...] = ()  # ids released since the last output


def accept_token(stream: SampleStream, token: int | None, now: float, eos: Collection[int],
                 max_model_len: int) -> tuple[str | None, str]:
    """Append a sampled token and produce its text. Returns the stop condition it fired (None if none:
    ``"eos"`` (``token`` is one of the ``eos`` ids), ``"stop"``, ``"length"`` or ``"failed"``) and, for
    ``"failed"``, why."""
    if token is None:
        return "failed", "the hard constraints mask every token"
    seq = stream.seq
    seq.output_ids.append(token)
    if token in eos and not seq.params.ignore_eos:
        return "eos", ""
    try:
        delta = stream.stops.push(stream.detok.update(seq.output_ids))
    except Exception as exc:  # e.g. the tokenizer cannot decode: this request fails, the others go on
        return "failed", repr(exc)
    stream.token_ends.append(len(stream.detok.text))
    stream.text += delta
    stream.delta += delta
    if stream.stops.finished:
        return "stop", ""
    if len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= max_model_len:
        return "length", ""
    stream.delta_ids += release_ids(stream, now)
    return None, ""


def release_ids(stream: SampleStream, now: float, partial: bool = False) -> tuple[int, ...]:
    """Hand out the token ids whose text has reached the caller (``partial``: also those cut by a stop
    string), stamping their emit time. An id whose text is still held back waits with it."""
    released, new = len(stream.text), []
    while len(stream.emitted_ids) < len(stream.token_ends):
        i = len(stream.emitted_ids)
        start = stream.token_ends[i - 1] if i else 0
        if not (stream.token_ends[i] <= released or (partial and start < released)):
            break
        stream.emitted_ids.append(stream.seq.output_ids[i])
        stream.seq.times.emits.append(now)
        new.append(stream.seq.output_ids[i])
    return tuple(new)


def settle(stream: SampleStream, reason: str, now: float) -> None:
    """Finish one sample's text: a normal end (length, EOS) releases the text held back for a possible
    stop string; a stop match releases the ids of tokens its text reaches into; cancelled, timed-out
    and failed samples drop whatever was still held (the client never sees it)."""
    seq = stream.seq
    if reason in ("length", "eos"):
        tail = stream.stops.push(stream.detok.update(seq.output_ids[:len(stream.token_ends)], final=True))
        tail += stream.stops.flush()
        stream.text += tail
        stream.delta += tail
        stream.token_ends = [min(end, len(stream.text)) for end in stream.token_ends]
    if reason in ("length", "eos", "stop"):
        stream.delta_ids += release_ids(stream, now, partial=reason == "stop")
    stream.finish_reason = reason
    stream.committed_at_end = seq.num_computed
    seq.times.finish = now


def request_output(request_id: str, streams: SequenceOf[SampleStream], finish_reason: str | None) -> RequestOutput:
    """The request's output for this step; hands out (and clears) each sample's pending delta."""
    finished = finish_reason is not None
    first = streams[0]
    samples = tuple(SampleOutput(s.index, s.delta, s.text, s.delta_ids, tuple(s.emitted_ids),
                                 s.finish_reason is not None, s.finish_reason)
                    for s in streams) if len(streams) > 1 else ()
    usage = TokenUsage(prompt_tokens=len(first.seq.prompt_ids), cached_prompt_tokens=first.seq.num_cached_prompt or 0,
                       generated=sum(len(s.seq.output_ids) for s in streams),
                       emitted=sum(len(s.emitted_ids) for s in streams),
                       committed=sum(s.committed_at_end if s.finish_reason is not None else s.seq.num_computed
                                     for s in streams))
    output = RequestOutput(request_id=request_id, delta=first.delta, text=first.text, delta_token_ids=first.delta_ids,
                           token_ids=tuple(first.emitted_ids), finished=finished, finish_reason=finish_reason,
                           usage=usage, timing=timing(first.seq) if finished and not samples else None,
                           samples=samples)
    for stream in streams:
        stream.delta, stream.delta_ids = "", ()
    return output


def timing(seq: Sequence) -> RequestTiming | None:
    """The stream's ``RequestTiming`` (arrival, first scheduled, emits, finish), None if nothing was emitted."""
    times = seq.times
    if not times.emits or times.first_scheduled is None:
        return None
    return RequestTiming(arrival=times.arrival, first_scheduled=times.first_scheduled,
                         emit_times=tuple(times.emits), finish=times.finish, prompt_tokens=len(seq.prompt_ids))
