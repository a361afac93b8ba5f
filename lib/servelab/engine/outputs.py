"""Output processing: sampled token ids -> text the caller may see, stop decisions, per-step outputs.

For each sampled token of each sample: append it, detokenise incrementally, pass the text through the
stop-string buffer (which holds back a tail that could still start a stop string), check EOS / stop /
length, and hand out the token ids whose text has reached the caller (stamping their emit time). When a
sample ends, `finish_text` releases or drops what was held back. :func:`request_output` builds the
step's :class:`RequestOutput` and clears the pending deltas.

System boundary: text and token ids of one engine; times are the engine clock's seconds. It frees no
resources (the engine's one terminal path does that through ``servelab.lifecycle.reclaim``).
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass

from servelab.engine.sampler import TokenLogprob
from servelab.engine.sequence import Sequence
from servelab.ledger import Usage
from servelab.metrics import RequestTiming


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
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token of this step's delta (EOS included)


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request: the new text and ids, plus the totals so far.

    With ``params.n > 1`` the request has ``n`` samples: ``samples`` holds all of them (empty when
    n == 1) and the text and id fields mirror sample 0, so code written for one answer still reads one.
    ``finished`` is True once every sample has finished; ``finish_reason`` is then the request's:
    cancelled / timed_out / failed when it was cut short, else that of the sample that finished last.
    ``usage`` sums the generated, emitted and committed tokens over the samples. ``timing`` is per
    token stream, so it is only set for n == 1.

    With ``params.logprobs`` set, ``logprobs`` holds one :class:`TokenLogprob` per token id handed out
    in this step, plus the EOS token's when the sample ends on it (generated, never emitted as text).
    With ``params.prompt_logprobs`` set, ``prompt_logprobs`` holds the prompt tokens after the first,
    once, in the output of the step that finished the prompt (None in every other output).
    """

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


class StepOutputs(list):
    """What one :meth:`~servelab.engine.LLMEngine.step` returns: its :class:`RequestOutput` list, plus
    ``admitted`` (ids of the requests a tick admitted this step, readmissions included),
    ``num_preempted`` (sequences preempted this step, by recompute or swap) and ``num_batched_tokens``
    (tokens the step's forward pass computed): what a server loop needs without reading the engine's
    inspection fields."""

    def __init__(self, outputs: list[RequestOutput] = (), admitted: tuple[str, ...] = (),
                 num_preempted: int = 0, num_batched_tokens: int = 0) -> None:
        super().__init__(outputs)
        self.admitted = admitted
        self.num_preempted = num_preempted
        self.num_batched_tokens = num_batched_tokens


def accept_token(seq: Sequence, token: int | None, now: float, eos: Collection[int],
                 max_model_len: int) -> tuple[str | None, str]:
    """Append a sampled token and produce its text. Returns the stop condition it fired (None if none:
    ``"eos"`` (``token`` is one of the ``eos`` ids), ``"stop"``, ``"length"`` or ``"failed"``) and, for
    ``"failed"``, why."""
    if token is None:
        return "failed", "the hard constraints mask every token"
    seq.output_ids.append(token)
    if token in eos and not seq.params.ignore_eos:
        return "eos", ""
    try:
        delta = seq.stops.push(seq.detok.update(seq.output_ids))
    except Exception as exc:  # e.g. the tokenizer cannot decode: this request fails, the others go on
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


def release_ids(seq: Sequence, now: float, partial: bool = False) -> tuple[int, ...]:
    """Hand out the token ids whose text has reached the caller (``partial``: also those cut by a stop
    string), stamping their emit time. An id whose text is still held back waits with it."""
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


def finish_text(seq: Sequence, reason: str, now: float) -> None:
    """Finish one sample's text: a normal end (length, EOS) releases the text held back for a possible
    stop string; a stop match releases the ids of tokens its text reaches into; cancelled, timed-out
    and failed samples drop whatever was still held (the client never sees it)."""
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


def request_output(request_id: str, seqs: SequenceOf[Sequence], finish_reason: str | None) -> RequestOutput:
    """The request's output for this step; hands out (and clears) each sample's pending delta."""
    finished = finish_reason is not None
    first = seqs[0]
    logprobs = [_logprobs_delta(s) for s in seqs]
    samples = tuple(SampleOutput(s.index, s.delta, s.text, s.delta_ids, tuple(s.emitted_ids),
                                 s.finish_reason is not None, s.finish_reason, lp)
                    for s, lp in zip(seqs, logprobs)) if len(seqs) > 1 else ()
    output = RequestOutput(request_id=request_id, delta=first.delta, text=first.text, delta_token_ids=first.delta_ids,
                           token_ids=tuple(first.emitted_ids), finished=finished, finish_reason=finish_reason,
                           usage=usage(seqs), timing=timing(first) if finished and not samples else None,
                           samples=samples, logprobs=logprobs[0], prompt_logprobs=_prompt_logprobs(first))
    for seq in seqs:
        seq.delta, seq.delta_ids = "", ()
    return output


def usage(seqs: SequenceOf[Sequence]) -> Usage:
    """The request's token counts so far, summed over its samples (a finished sample counts what it
    held when it finished)."""
    first = seqs[0]
    return Usage(prompt_tokens=len(first.prompt_ids), cached_prompt_tokens=first.cached_prompt_tokens or 0,
                 generated_tokens=sum(len(s.output_ids) for s in seqs), emitted_tokens=sum(len(s.emitted_ids) for s in seqs),
                 committed_tokens=sum(s.committed_at_end if s.finish_reason is not None else s.num_computed
                                      for s in seqs))


def _logprobs_delta(seq: Sequence) -> tuple[TokenLogprob, ...]:
    """The logprobs of the ids released since the last output, and of a final EOS (never released)."""
    end = len(seq.logprobs) if seq.finish_reason == "eos" else min(len(seq.emitted_ids), len(seq.logprobs))
    new = tuple(seq.logprobs[seq.logprobs_sent:end])
    seq.logprobs_sent = max(seq.logprobs_sent, end)
    return new


def _prompt_logprobs(seq: Sequence) -> tuple[TokenLogprob, ...] | None:
    """The prompt's logprobs once all are computed, handed out once."""
    if (seq.params.prompt_logprobs is None or seq.prompt_logprobs_sent
            or len(seq.prompt_logprobs) < len(seq.prompt_ids) - 1):
        return None
    seq.prompt_logprobs_sent = True
    return tuple(seq.prompt_logprobs)


def timing(seq: Sequence) -> RequestTiming | None:
    """The stream's ``RequestTiming`` (arrival, first scheduled, emits, finish), None if nothing was emitted."""
    times = seq.times
    if not times.emits or times.first_scheduled is None:
        return None
    return RequestTiming(arrival=times.arrival, first_scheduled=times.first_scheduled,
                         emit_times=tuple(times.emits), finish=times.finish, prompt_tokens=len(seq.prompt_ids))
