"""``LLMEngine``: requests in, streamed text out, one scheduler tick + forward pass per :meth:`step`.

A step: expire deadlines -> one scheduler tick (admissions, preemptions, swaps, token budget) -> one
forward pass over the mixed batch -> sample the rows whose chunk reached their last token -> turn new
tokens into text (incremental detokenisation, stop strings) -> check EOS / stop / length -> reclaim the
requests that ended -> one trace record.

Every terminal path (finished, cancelled, timed out, failed) goes through :meth:`LLMEngine._end`, which
calls the one reclaim routine of ``servelab.lifecycle``: it frees the KV blocks, reservation, batch slot
and host swap space and writes the request's single terminal record to :attr:`LLMEngine.ledger`.

Parallel sampling (``params.n > 1``): the prompt is prefilled once, by sample 0's sequence, which holds a
batch slot for each sibling from admission on. When its last prompt chunk has run, the engine forks it
(``Scheduler.fork`` -> ``BlockAllocator.fork``): every sibling's block table shares the prompt's blocks
(refcount n, ``M_KV ~ M_prompt + n * M_generated``), each sample draws its first token from the same
last-position logits with its own generator (seed + i), and the first write into the shared partially
filled tail is copied on write through the scheduler's ``BlockCopy`` path. Then the samples decode, and
may be preempted, as independent sequences. A sample that finishes while siblings go on returns its
blocks and slot at once; the request ends when the last sample does, or, cancelled / timed out / failed,
all at once through the one ``reclaim`` call over every sample's sequence id.

:meth:`LLMEngine.pause` / :meth:`LLMEngine.resume` deschedule a request, the third kind of preemption
next to recompute and swap: it skips the steps while keeping its KV blocks (compute freed, not memory).

System boundary: timestamps are taken with the injected ``clock`` (seconds) at the engine API: arrival is
``add_request``, an emit is the end of the step that hands a token to the caller. Network, HTTP and
queueing in front of the engine are outside.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator, Sequence as SequenceOf
from dataclasses import dataclass, field
from pathlib import Path

import torch

from servelab.chat_template import ChatTemplate
from servelab.engine.config import EngineConfig
from servelab.engine.model_runner import ModelRunner, resolve_device_dtype
from servelab.engine.sampler import SamplingRow, sample_tokens
from servelab.engine.scheduler import Scheduler, SchedulerOutput
from servelab.engine.sequence import IncrementalDetokenizer, Sequence, SequenceTimes
from servelab.engine.trace import StepRecord
from servelab.kv import BlockAllocator
from servelab.lifecycle import Ledger, RequestLifecycle, RequestState, SlotPool, Usage, reclaim
from servelab.metrics import RequestTiming
from servelab.model.llama import LlamaForCausalLM
from servelab.sampling import SamplingParams
from servelab.streaming import StopStringBuffer

FINISH_REASONS = ("stop", "length", "eos", "cancelled", "timed_out", "failed")
_TERMINAL_STATE = {"stop": RequestState.FINISHED, "length": RequestState.FINISHED, "eos": RequestState.FINISHED,
                   "cancelled": RequestState.CANCELLED, "timed_out": RequestState.TIMED_OUT,
                   "failed": RequestState.FAILED}


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


@dataclass(frozen=True)
class EngineStats:
    """The engine's load between two steps: sequences per scheduler queue, and the fraction of KV blocks
    in use (``kv_cache_usage`` in [0, 1]; blocks only in the prefix cache count as free)."""

    num_running: int
    num_waiting: int
    num_swapped: int
    kv_cache_usage: float


@dataclass(eq=False)
class _Sample:
    """One sample's generation state around its scheduler :class:`Sequence` (a request has ``n``)."""

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


@dataclass(eq=False)
class _Request:
    """Engine-side state of one request: its lifecycle and its samples (one unless ``params.n > 1``).

    Before the fork only sample 0's sequence is scheduled; it holds a batch slot for every sibling.
    """

    request_id: str
    lifecycle: RequestLifecycle
    samples: list[_Sample]
    forked: bool = False
    finish_reason: str | None = None

    @property
    def seq(self) -> Sequence:
        """Sample 0's sequence: the one scheduled before the fork, the only one when n == 1."""
        return self.samples[0].seq


class LLMEngine:
    """A small continuous-batching engine over a paged KV cache. See the module docstring."""

    chat_template: ChatTemplate | None = None  # the checkpoint's, set by from_pretrained; None: it has none

    def __init__(self, model: LlamaForCausalLM, tokenizer, config: EngineConfig | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if not isinstance(model, LlamaForCausalLM):
            raise TypeError(f"model must be a servelab LlamaForCausalLM, got {type(model).__name__}")
        for name in ("encode", "decode"):
            if not callable(getattr(tokenizer, name, None)):
                raise TypeError(f"tokenizer must have encode() and decode() (a tokenizers.Tokenizer), "
                                f"got {type(tokenizer).__name__}")
        config = EngineConfig() if config is None else config
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        self.config = config
        self.tokenizer = tokenizer
        self.clock = clock
        self.max_model_len = self._check_max_model_len(model, config)
        self.runner = ModelRunner(model, config)
        # cache_on_compute: a block enters the prefix cache only once the scheduler commits its KV
        self.allocator = BlockAllocator(self.runner.num_blocks, config.block_size, config.enable_prefix_caching,
                                        cache_on_compute=True)
        self.slots = SlotPool(config.max_num_seqs)
        self.scheduler = Scheduler(config, self.allocator, self.runner, self.slots)
        self.ledger = Ledger()
        self.trace: list[StepRecord] = []
        self.last_schedule: SchedulerOutput | None = None  # the most recent scheduler tick, for inspection
        self._requests: dict[str, _Request] = {}
        self._samples: dict[str, _Sample] = {}  # by sequence id: every sample of every live request
        self._pending: list[RequestOutput] = []  # final outputs of requests ended between steps
        self._arrivals = itertools.count()
        self._auto_ids = itertools.count()
        self._seed_rng = random.Random(config.seed)
        self._eos = model.config.eos_token_id

    @classmethod
    def from_pretrained(cls, path_or_id: str | Path | None = None, *, allow_download: bool = False,
                        device: str | None = None, dtype: str | None = None,
                        clock: Callable[[], float] = time.perf_counter, **config) -> "LLMEngine":
        """An engine over a Llama checkpoint folder (default: the shipped Shakespeare model) with its
        tokenizer and chat template (:attr:`chat_template`), or over a Hugging Face Hub id such as
        ``"HuggingFaceTB/SmolLM2-135M-Instruct"`` when ``allow_download=True`` (never by default).

        ``device`` / ``dtype`` default to :func:`servelab.device.pick_device`; other keyword arguments are
        :class:`EngineConfig` fields. See :mod:`servelab.model.pretrained`.
        """
        from servelab.model.pretrained import load_pretrained

        engine_config = EngineConfig(device=device, dtype=dtype, **config)
        where, precision = resolve_device_dtype(engine_config)
        model, tokenizer, template = load_pretrained(path_or_id, allow_download=allow_download,
                                                     device=where, dtype=precision)
        engine = cls(model, tokenizer, engine_config, clock=clock)
        engine.chat_template = template
        return engine

    # ------------------------------------------------------------------------------------------ API

    def add_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None,
                    deadline_s: float | None = None, namespace: str = "", priority: int = 0) -> str:
        """Queue a request; returns its id.

        ``prompt`` is text or token ids. ``deadline_s`` (seconds after arrival) ends it as ``timed_out``
        if it has not finished by then. ``namespace`` salts the prefix cache (tenants never share KV
        across namespaces). ``priority`` orders the queue under the ``"priority"`` policy (lower first).
        """
        arrival = self.clock()
        prompt_ids = self._prompt_ids(prompt)
        self._check_params(params, prompt_ids)
        request_id = self._new_request_id(request_id)
        if deadline_s is not None and (isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float))
                                       or not deadline_s > 0):
            raise ValueError(f"deadline_s must be a positive number of seconds or None, got {deadline_s!r}")
        if not isinstance(namespace, str):
            raise TypeError(f"namespace must be a str, got {type(namespace).__name__}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {type(priority).__name__}")
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(63)
        arrival_index = next(self._arrivals)
        samples = []
        for i, seq_id in enumerate(self._sample_ids(request_id, params.n)):
            seq = Sequence(seq_id, prompt_ids, params, arrival_index, SequenceTimes(arrival),
                           torch.Generator().manual_seed(seed + i), namespace=namespace, priority=priority,
                           deadline=None if deadline_s is None else arrival + deadline_s)
            samples.append(_Sample(i, request_id, seq, IncrementalDetokenizer(self.tokenizer),
                                   StopStringBuffer(list(params.stop))))
        samples[0].seq.samples_to_fork = params.n - 1
        lifecycle = RequestLifecycle(request_id, at=arrival)
        lifecycle.transition(RequestState.VALIDATED, arrival)
        lifecycle.transition(RequestState.QUEUED, arrival)
        self._requests[request_id] = _Request(request_id, lifecycle, samples)
        self._samples.update((s.seq.seq_id, s) for s in samples)
        self.scheduler.add(samples[0].seq)  # the siblings join when it forks, after its prompt
        return request_id

    def stats(self) -> EngineStats:
        """Sequences running, waiting and swapped out now, and the KV pool's used fraction."""
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting), len(self.scheduler.swapped),
                           self.allocator.num_used_blocks / self.allocator.num_blocks)

    def has_unfinished(self) -> bool:
        """True while some request has not ended (or an ended one's final output is not yet returned)."""
        return bool(self._requests or self._pending)

    def cancel(self, request_id: str) -> bool:
        """Cancel a request; its final output (``finish_reason="cancelled"``) comes from the next step.

        Returns False when it had already ended. Raises KeyError for an id this engine never issued.
        """
        request = self._live(request_id)
        if request is None:
            return False
        self._pending.append(self._end(request, "cancelled"))
        return True

    def pause(self, request_id: str) -> bool:
        """Deschedule a request until :meth:`resume`: no step computes or samples it meanwhile.

        It keeps everything it holds: a running request its KV blocks (and any reservation) and its
        batch slot, so this frees compute, not memory (KV pressure can still preempt it by recompute or
        swap). A waiting request is not admitted, a swapped one not swapped in. A request in decode
        enters BACKPRESSURED (the lifecycle's paused-with-KV state); in other stages its lifecycle state
        stays. Its deadline still runs and :meth:`cancel` still works, both through the one reclaim path.
        Pausing a paused request changes nothing. Returns False when it had already ended; KeyError for
        an unknown id.
        """
        return self._set_paused(request_id, True)

    def resume(self, request_id: str) -> bool:
        """Undo :meth:`pause`: the next step schedules the request again, from exactly where it stopped.

        BACKPRESSURED goes back to DECODE. Resuming a request that is not paused changes nothing.
        Returns False when it had already ended; KeyError for an unknown id.
        """
        return self._set_paused(request_id, False)

    def _set_paused(self, request_id: str, paused: bool) -> bool:
        """Flag every sample of a live request; DECODE <-> BACKPRESSURED follows the flag."""
        request = self._live(request_id)
        if request is None:
            return False
        for sample in request.samples:
            sample.seq.paused = paused
        leave, enter = ((RequestState.DECODE, RequestState.BACKPRESSURED) if paused
                        else (RequestState.BACKPRESSURED, RequestState.DECODE))
        if request.lifecycle.state is leave:
            request.lifecycle.transition(enter, self.clock())
        return True

    def step(self) -> list[RequestOutput]:
        """Run one iteration; returns the outputs (deltas) it produced, finished requests included.

        A step in which nothing happened returns ``[]`` and leaves no trace record.
        """
        record = StepRecord(step=len(self.trace), start=self.clock())
        outputs, self._pending = self._pending, []
        outputs += self._expire_deadlines(record.start)
        sched = self.last_schedule = self.scheduler.schedule()
        self._apply_transitions(sched, record.start)
        ready = [seq for seq in self.scheduler.waiting if not seq.paused]
        if not sched.is_empty:
            outputs += self._run(sched, record)
        elif ready and not (self.scheduler.running or self.scheduler.swapped):
            # an idle engine that cannot admit its first waiting request never will: fail it, not hang
            stuck = self._request_of(min(ready, key=self.scheduler.key).seq_id)
            outputs.append(self._end(stuck, "failed", detail="cannot be scheduled even on an idle engine"))
        if sched.is_empty and not (outputs or sched.preempted or sched.swapped_out or sched.swapped_in):
            return outputs
        for output in outputs:
            if output.finished:
                record.finished[output.request_id] = output.finish_reason
        self._fill_record(record, sched)
        self.trace.append(record)
        return outputs

    def stream(self, prompt: str | list[int], params: SamplingParams, **kwargs) -> Iterator[str]:
        """Yield the text deltas of one new request as steps produce them.

        This drives :meth:`step` itself: other queued requests advance too, but their outputs are not
        returned here (a server with many clients calls :meth:`step` and routes outputs instead).
        Closing the generator early cancels the request. ``kwargs`` go to :meth:`add_request`. With
        ``params.n > 1`` the deltas are sample 0's (see :class:`RequestOutput`).
        """
        request_id = self.add_request(prompt, params, **kwargs)
        finished = False
        try:
            while not finished:
                for output in self.step():
                    if output.request_id == request_id:
                        finished = output.finished
                        if output.delta:
                            yield output.delta
        finally:
            if not finished:  # the reader is gone: cancel, and drop the final output nobody will read
                self.cancel(request_id)
                self._pending = [o for o in self._pending if o.request_id != request_id]

    def generate(self, prompts: SequenceOf[str | list[int]] | str,
                 params: SamplingParams | SequenceOf[SamplingParams]) -> list[RequestOutput]:
        """Offline batch: run all ``prompts`` to completion; returns each one's final output, in order.

        Like :meth:`stream`, it drives :meth:`step` itself, so outputs of other requests already in the
        engine are consumed and not returned.
        """
        if isinstance(prompts, str):
            prompts = [prompts]
        params_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(params_list) != len(prompts):
            raise ValueError(f"params must be one SamplingParams or one per prompt ({len(prompts)}), "
                             f"got {len(params_list)}")
        ids: list[str] = []
        try:
            for prompt, sp in zip(prompts, params_list):
                ids.append(self.add_request(prompt, sp))
        except (TypeError, ValueError):  # one bad prompt: withdraw the ones already queued, then report it
            for request_id in ids:
                self.cancel(request_id)
            self._pending = [o for o in self._pending if o.request_id not in ids]
            raise
        final: dict[str, RequestOutput] = {}
        wanted = set(ids)
        while len(final) < len(ids):
            for output in self.step():
                if output.finished and output.request_id in wanted:  # another request's end is not ours
                    final[output.request_id] = output
        return [final[i] for i in ids]

    # ------------------------------------------------------------------------------------------ one step

    def _run(self, sched: SchedulerOutput, record: StepRecord) -> list[RequestOutput]:
        """Forward pass over the scheduled chunks, then sampling and output processing."""
        samples = [self._samples[c.seq_id] for c in sched.chunks]
        rows = [(s.seq.token_ids[c.start:c.start + c.num_tokens], c.start,
                 self.allocator.block_table(c.seq_id), c.sample) for s, c in zip(samples, sched.chunks)]
        for sample, chunk in zip(samples, sched.chunks):
            # decode = computing the newest generated token; anything else is (re)filling the cache
            decode = chunk.sample and chunk.num_tokens == 1 and chunk.start >= len(sample.seq.prompt_ids)
            counts = record.decode_tokens if decode else record.prefill_tokens
            counts[chunk.seq_id] = chunk.num_tokens
            record.positions[chunk.seq_id] = (chunk.start, chunk.start + chunk.num_tokens)
            if sample.seq.times.first_scheduled is None:
                sample.seq.times.first_scheduled = record.start
        requests = list(dict.fromkeys(self._requests[s.request_id] for s in samples))
        try:
            logits = self.runner.execute(rows)
        except Exception as exc:  # the forward pass failed: every request in it fails, nothing leaks
            return [self._end(r, "failed", detail=repr(exc)) for r in requests]
        for sample, chunk in zip(samples, sched.chunks):
            self.scheduler.commit(chunk, sample.seq)
        picks = self._fork_finished_prompts([s for s, c in zip(samples, sched.chunks) if c.sample])
        sampled = [s for s, _ in picks]
        try:
            if len(picks) != logits.shape[0]:  # forked samples draw from their parent's logits row
                logits = logits[torch.tensor([row for _, row in picks], device=logits.device)]
            tokens = sample_tokens(logits, [SamplingRow(s.seq.params, s.seq.prompt_ids, s.seq.output_ids,
                                                        s.seq.generator) for s in sampled])
        except Exception as exc:
            return [self._end(r, "failed", detail=repr(exc))
                    for r in dict.fromkeys(self._requests[s.request_id] for s in sampled)]
        now = self.clock()
        stops: dict[_Request, list[tuple[_Sample, str]]] = {}  # every sampled request, in batch order
        failures: dict[_Request, str] = {}
        for sample, token in zip(sampled, tokens):
            request = self._requests[sample.request_id]
            stops.setdefault(request, [])
            if request in failures:  # a sibling already failed it: the whole request ends
                continue
            reason, detail = self._accept(request, sample, token, now)
            if reason == "failed":
                failures[request] = detail
            elif reason is not None:
                stops[request].append((sample, reason))
        return [self._conclude(r, stops[r], failures.get(r)) for r in stops]

    def _fork_finished_prompts(self, sampled: list[_Sample]) -> list[tuple[_Sample, int]]:
        """Fork each request whose prompt just got computed into its ``n`` samples.

        Returns the samples to draw a token for, each with the logits row it draws from: a forked
        request's samples all read the row of its last prompt position.
        """
        picks: list[tuple[_Sample, int]] = []
        for row, sample in enumerate(sampled):
            request = self._requests[sample.request_id]
            if len(request.samples) > 1 and not request.forked:
                siblings = request.samples[1:]
                self.scheduler.fork(sample.seq, [s.seq for s in siblings])
                for sibling in siblings:
                    sibling.seq.times.first_scheduled = sample.seq.times.first_scheduled
                request.forked = True
                picks += [(s, row) for s in request.samples]
            else:
                picks.append((sample, row))
        return picks

    def _accept(self, request: _Request, sample: _Sample, token: int | None,
                now: float) -> tuple[str | None, str]:
        """Append a sampled token to ``sample`` and produce its text.

        Returns the stop condition it fired (None if none) and, for ``"failed"``, why.
        """
        seq = sample.seq
        if token is None:
            return "failed", "the hard constraints mask every token"
        seq.output_ids.append(token)
        if request.lifecycle.state is RequestState.PREFILL:
            request.lifecycle.transition(RequestState.DECODE, now)
        try:
            reason, delta = self._new_text(sample, token)
        except Exception as exc:  # e.g. the tokenizer cannot decode: this request fails, the others go on
            return "failed", repr(exc)
        sample.text += delta
        sample.delta += delta
        if reason is None:
            sample.delta_ids += self._release_ids(sample, now)
        return reason, ""

    def _conclude(self, request: _Request, stops: list[tuple[_Sample, str]], failure: str | None) -> RequestOutput:
        """This step's output for a request with sampled tokens: settle the samples that stopped, free
        their KV early when siblings go on, and end the request once no sample is left."""
        if failure is not None:
            return self._end(request, "failed", detail=failure)
        if not stops:
            return self._output(request)
        now = self.clock()
        for sample, reason in stops:
            self._settle(sample, reason, now)
        if all(s.finish_reason is not None for s in request.samples):
            return self._end(request, stops[-1][1], at=now)
        for sample, _ in stops:  # siblings still decode: its blocks and slot go back now
            self.scheduler.drop(sample.seq)
            self.allocator.free(sample.seq.seq_id)
            self.slots.release(sample.seq.seq_id)
        return self._output(request)

    def _new_text(self, sample: _Sample, token: int) -> tuple[str | None, str]:
        """The stop condition that ``token`` fired (None if none) and the text now safe to send."""
        seq = sample.seq
        if token == self._eos and not seq.params.ignore_eos:
            return "eos", ""
        delta = sample.stops.push(sample.detok.update(seq.output_ids))
        sample.token_ends.append(len(sample.detok.text))
        if sample.stops.finished:
            return "stop", delta
        if len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length", delta
        return None, delta

    @staticmethod
    def _release_ids(sample: _Sample, now: float, partial: bool = False) -> tuple[int, ...]:
        """Hand out the token ids whose text has reached the caller (``partial``: also those cut by a stop
        string), stamping their emit time. An id whose text is still held back waits with it."""
        released, new = len(sample.text), []
        while len(sample.emitted_ids) < len(sample.token_ends):
            i = len(sample.emitted_ids)
            start = sample.token_ends[i - 1] if i else 0
            if not (sample.token_ends[i] <= released or (partial and start < released)):
                break
            sample.emitted_ids.append(sample.seq.output_ids[i])
            sample.seq.times.emits.append(now)
            new.append(sample.seq.output_ids[i])
        return tuple(new)

    def _expire_deadlines(self, now: float) -> list[RequestOutput]:
        expired = [r for r in self._requests.values() if r.seq.deadline is not None and now >= r.seq.deadline]
        return [self._end(r, "timed_out") for r in expired]

    def _apply_transitions(self, sched: SchedulerOutput, now: float) -> None:
        """Mirror the tick's decisions in each request's lifecycle (in the order they happened).

        After the fork the lifecycle stays in DECODE while any sample runs: a sample's own preemption
        shows in the trace, not in the request's state.
        """
        def unforked(seq_ids: list[str]) -> list[_Request]:
            return [r for r in map(self._request_of, seq_ids) if not r.forked]

        for request in unforked(sched.swapped_in):
            resumed = RequestState.DECODE if request.seq.output_ids else RequestState.PREFILL
            request.lifecycle.transition(resumed, now)
        for request in unforked(sched.preempted):
            request.lifecycle.transition(RequestState.PREEMPTED, now)
        for request in unforked(sched.swapped_out):
            request.lifecycle.transition(RequestState.SWAPPED, now)
        for request in unforked(sched.admitted):
            request.lifecycle.transition(RequestState.PREFILL, now)

    # ------------------------------------------------------------------------------------------ the end

    def _settle(self, sample: _Sample, reason: str, now: float) -> None:
        """Finish one sample's text: a normal end (length, EOS) releases the text held back for a possible
        stop string; a stop match releases the ids of tokens its text reaches into; cancelled, timed-out
        and failed samples drop whatever was still held (the client never sees it)."""
        seq = sample.seq
        if reason in ("length", "eos"):
            tail = sample.stops.push(sample.detok.update(seq.output_ids[:len(sample.token_ends)], final=True))
            tail += sample.stops.flush()
            sample.text += tail
            sample.delta += tail
            sample.token_ends = [min(end, len(sample.text)) for end in sample.token_ends]
        if reason in ("length", "eos", "stop"):
            sample.delta_ids += self._release_ids(sample, now, partial=reason == "stop")
        sample.finish_reason = reason
        sample.committed_at_end = seq.num_computed
        seq.times.finish = now

    def _end(self, request: _Request, reason: str, detail: str = "", at: float | None = None) -> RequestOutput:
        """The one terminal path: settle every unfinished sample with ``reason``, reclaim every resource
        of every sample's sequence in one ``reclaim`` call, write the terminal record.

        ``at`` is the end time when the caller already read the clock for it.
        """
        now = self.clock() if at is None else at
        for sample in request.samples:
            if sample.finish_reason is None:
                self._settle(sample, reason, now)
        request.finish_reason = reason
        seqs = [s.seq for s in request.samples]
        usage = Usage(prompt_tokens=len(seqs[0].prompt_ids), generated_tokens=sum(len(q.output_ids) for q in seqs),
                      emitted_tokens=sum(len(s.emitted_ids) for s in request.samples))
        reclaim(request.lifecycle, _TERMINAL_STATE[reason], ledger=self.ledger, at=now,
                reason=f"{reason}: {detail}" if detail else reason, allocator=self.allocator,
                seq_ids=[q.seq_id for q in seqs], slots=self.slots, host_swap=self.runner.host_swap, usage=usage)
        for seq in seqs:
            self.scheduler.drop(seq)
            del self._samples[seq.seq_id]
        del self._requests[request.request_id]
        return self._output(request)

    def _output(self, request: _Request) -> RequestOutput:
        """The request's output for this step; hands out (and clears) each sample's pending delta."""
        finished = request.finish_reason is not None
        first, seqs = request.samples[0], [s.seq for s in request.samples]
        samples = tuple(SampleOutput(s.index, s.delta, s.text, s.delta_ids, tuple(s.emitted_ids),
                                     s.finish_reason is not None, s.finish_reason)
                        for s in request.samples) if len(request.samples) > 1 else ()
        committed = sum(s.committed_at_end if s.finish_reason is not None else s.seq.num_computed
                        for s in request.samples)
        output = RequestOutput(
            request_id=request.request_id, delta=first.delta, text=first.text, delta_token_ids=first.delta_ids,
            token_ids=tuple(first.emitted_ids), finished=finished, finish_reason=request.finish_reason,
            usage=TokenUsage(prompt_tokens=len(first.seq.prompt_ids),
                             cached_prompt_tokens=first.seq.num_cached_prompt or 0,
                             generated=sum(len(q.output_ids) for q in seqs),
                             emitted=sum(len(s.emitted_ids) for s in request.samples), committed=committed),
            timing=self._timing(first.seq) if finished and not samples else None, samples=samples)
        for sample in request.samples:
            sample.delta, sample.delta_ids = "", ()
        return output

    @staticmethod
    def _timing(seq: Sequence) -> RequestTiming | None:
        times = seq.times
        if not times.emits or times.first_scheduled is None:
            return None
        return RequestTiming(arrival=times.arrival, first_scheduled=times.first_scheduled,
                             emit_times=tuple(times.emits), finish=times.finish, prompt_tokens=len(seq.prompt_ids))

    # ------------------------------------------------------------------------------------------ helpers

    def _fill_record(self, record: StepRecord, sched: SchedulerOutput) -> None:
        record.admitted = list(sched.admitted)
        record.preempted = list(sched.preempted)
        record.swapped_out = list(sched.swapped_out)
        record.swapped_in = list(sched.swapped_in)
        record.descheduled = list(sched.descheduled)
        record.paused = list(sched.paused)
        record.blocks_used = self.allocator.num_used_blocks
        record.blocks_free = self.allocator.num_free_blocks
        record.blocks_shared = sum(1 for holders in self.allocator.owners().values() if len(holders) > 1)
        record.blocks_cached = self.allocator.num_cached_free_blocks
        record.num_waiting = len(self.scheduler.waiting)
        record.num_running = len(self.scheduler.running)
        record.num_swapped = len(self.scheduler.swapped)
        record.end = self.clock()

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt).ids
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            vocab = self.runner.model.config.vocab_size
            for token in ids:
                if isinstance(token, bool) or not isinstance(token, int):
                    raise TypeError(f"prompt token ids must be ints, got {type(token).__name__}")
                if not 0 <= token < vocab:
                    raise ValueError(f"prompt token id {token} is outside the vocabulary [0, {vocab - 1}]")
        else:
            raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("prompt must contain at least one token, got an empty prompt")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; the context limit max_model_len={self.max_model_len} "
                             "leaves no room for a generated token")
        return ids

    def _check_params(self, params: SamplingParams, prompt_ids: list[int]) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"params.n={params.n} samples need as many batch slots at once, but max_num_seqs is "
                             f"{self.config.max_num_seqs}; lower n or raise max_num_seqs")
        vocab = self.runner.model.config.vocab_size
        named = [*(t for t, _ in params.logit_bias), *(params.allowed_token_ids or ()),
                 *(t for seq in params.banned_sequences for t in seq)]
        bad = [t for t in named if t >= vocab]
        if bad:
            raise ValueError(f"params name token ids outside the vocabulary [0, {vocab - 1}]: {bad[:5]}")
        longest = min(len(prompt_ids) + params.max_tokens, self.max_model_len)
        blocks = -(-longest // self.config.block_size)
        if blocks > self.runner.num_blocks:
            raise ValueError(f"prompt + max_tokens needs up to {blocks} KV blocks but the pool has "
                             f"{self.runner.num_blocks}; lower max_tokens or enlarge num_blocks")

    def _new_request_id(self, request_id: str | None) -> str:
        """The caller's id after checks, or a fresh ``req-N`` id."""
        if request_id is None:
            request_id = f"req-{next(self._auto_ids)}"
            while self._id_in_use(request_id):
                request_id = f"req-{next(self._auto_ids)}"
            return request_id
        if not isinstance(request_id, str) or not request_id:
            raise TypeError(f"request_id must be a non-empty str or None, got {request_id!r}")
        if self._id_in_use(request_id):
            raise ValueError(f"request_id {request_id!r} is already in use")
        return request_id

    def _sample_ids(self, request_id: str, n: int) -> list[str]:
        """Sequence ids of a request's ``n`` samples: the request id, then ``<request_id>/<i>``."""
        ids = [request_id] + [f"{request_id}/{i}" for i in range(1, n)]
        taken = [seq_id for seq_id in ids[1:] if self._id_in_use(seq_id)]
        if taken:
            raise ValueError(f"sample sequence ids {taken} of request {request_id!r} are already in use")
        return ids

    def _request_of(self, seq_id: str) -> _Request:
        """The live request that sequence ``seq_id`` samples for."""
        return self._requests[self._samples[seq_id].request_id]

    def _live(self, request_id: str) -> _Request | None:
        """The request if it has not ended; None if it has; KeyError for an id this engine never issued."""
        request = self._requests.get(request_id)
        if request is None and not self.ledger.has(request_id):
            raise KeyError(f"request_id {request_id!r} is unknown to this engine")
        return request

    def _id_in_use(self, request_id: str) -> bool:
        return request_id in self._requests or request_id in self._samples or self.ledger.has(request_id)

    @staticmethod
    def _check_max_model_len(model: LlamaForCausalLM, config: EngineConfig) -> int:
        limit = model.config.max_position_embeddings
        max_len = config.max_model_len or limit
        if max_len > limit:
            raise ValueError(f"max_model_len must be <= the model's max_position_embeddings ({limit}), got {max_len}")
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_len:
            raise ValueError(
                f"with chunked prefill off, max_num_batched_tokens ({config.max_num_batched_tokens}) must be >= "
                f"max_model_len ({max_len}) so that any prompt fits one iteration")
        return max_len
