"""``LLMEngine``: requests in, streamed text out, one scheduler tick + forward pass per :meth:`step`.

A step: expire deadlines -> one scheduler tick (admissions, preemptions, swaps, token budget) -> one
forward pass over the mixed batch -> sample the rows whose chunk reached their last token -> turn new
tokens into text (incremental detokenisation, stop strings) -> check EOS / stop / length -> reclaim the
requests that ended -> one trace record.

Every terminal path (finished, cancelled, timed out, failed) goes through :meth:`LLMEngine._end`, which
calls the one reclaim routine of ``servelab.lifecycle``: it frees the KV blocks, reservation, batch slot
and host swap space and writes the request's single terminal record to :attr:`LLMEngine.ledger`.

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
class RequestOutput:
    """What one step produced for one request: the new text and ids, plus the totals so far."""

    request_id: str
    delta: str
    text: str
    delta_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None
    usage: TokenUsage
    timing: RequestTiming | None  # set once finished, when at least one token was emitted


@dataclass(eq=False)
class _Request:
    """Engine-side state of one request around its scheduler :class:`Sequence`."""

    seq: Sequence
    lifecycle: RequestLifecycle
    detok: IncrementalDetokenizer
    stops: StopStringBuffer
    text: str = ""
    token_ends: list[int] = field(default_factory=list)  # decoded text length after each generated token
    emitted_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    committed_at_end: int = 0


class LLMEngine:
    """A small continuous-batching engine over a paged KV cache. See the module docstring."""

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
        self._pending: list[RequestOutput] = []  # final outputs of requests ended between steps
        self._arrivals = itertools.count()
        self._auto_ids = itertools.count()
        self._seed_rng = random.Random(config.seed)
        self._eos = model.config.eos_token_id

    @classmethod
    def from_pretrained(cls, directory: str | Path | None = None, clock: Callable[[], float] = time.perf_counter,
                        **config) -> "LLMEngine":
        """Load a Llama checkpoint folder (default: the shipped Shakespeare model) and its tokenizer.

        Keyword arguments are :class:`EngineConfig` fields.
        """
        from servelab.model import load_checkpoint, load_tokenizer

        engine_config = EngineConfig(**config)
        device, dtype = resolve_device_dtype(engine_config)
        model = load_checkpoint(directory, device=device, dtype=dtype)
        return cls(model, load_tokenizer(directory), engine_config, clock=clock)

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
        seq = Sequence(request_id, prompt_ids, params, next(self._arrivals), SequenceTimes(arrival),
                       torch.Generator().manual_seed(seed), namespace=namespace, priority=priority,
                       deadline=None if deadline_s is None else arrival + deadline_s)
        lifecycle = RequestLifecycle(request_id, at=arrival)
        lifecycle.transition(RequestState.VALIDATED, arrival)
        lifecycle.transition(RequestState.QUEUED, arrival)
        self._requests[request_id] = _Request(seq, lifecycle, IncrementalDetokenizer(self.tokenizer),
                                              StopStringBuffer(list(params.stop)))
        self.scheduler.add(seq)
        return request_id

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
        request = self._live(request_id)
        if request is None:
            return False
        request.seq.paused = True
        if request.lifecycle.state is RequestState.DECODE:
            request.lifecycle.transition(RequestState.BACKPRESSURED, self.clock())
        return True

    def resume(self, request_id: str) -> bool:
        """Undo :meth:`pause`: the next step schedules the request again, from exactly where it stopped.

        BACKPRESSURED goes back to DECODE. Resuming a request that is not paused changes nothing.
        Returns False when it had already ended; KeyError for an unknown id.
        """
        request = self._live(request_id)
        if request is None:
            return False
        request.seq.paused = False
        if request.lifecycle.state is RequestState.BACKPRESSURED:
            request.lifecycle.transition(RequestState.DECODE, self.clock())
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
            stuck = self._requests[min(ready, key=self.scheduler.key).seq_id]
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
        Closing the generator early cancels the request. ``kwargs`` go to :meth:`add_request`.
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
        requests = [self._requests[c.seq_id] for c in sched.chunks]
        rows = [(r.seq.token_ids[c.start:c.start + c.num_tokens], c.start,
                 self.allocator.block_table(c.seq_id), c.sample) for r, c in zip(requests, sched.chunks)]
        for request, chunk in zip(requests, sched.chunks):
            # decode = computing the newest generated token; anything else is (re)filling the cache
            decode = chunk.sample and chunk.num_tokens == 1 and chunk.start >= len(request.seq.prompt_ids)
            counts = record.decode_tokens if decode else record.prefill_tokens
            counts[chunk.seq_id] = chunk.num_tokens
            record.positions[chunk.seq_id] = (chunk.start, chunk.start + chunk.num_tokens)
            if request.seq.times.first_scheduled is None:
                request.seq.times.first_scheduled = record.start
        try:
            logits = self.runner.execute(rows)
        except Exception as exc:  # the forward pass failed: every request in it fails, nothing leaks
            return [self._end(r, "failed", detail=repr(exc)) for r in requests]
        for request, chunk in zip(requests, sched.chunks):
            self.scheduler.commit(chunk, request.seq)
        sampled = [r for r, c in zip(requests, sched.chunks) if c.sample]
        try:
            tokens = sample_tokens(logits, [SamplingRow(r.seq.params, r.seq.prompt_ids, r.seq.output_ids,
                                                        r.seq.generator) for r in sampled])
        except Exception as exc:
            return [self._end(r, "failed", detail=repr(exc)) for r in sampled]
        now = self.clock()
        return [self._accept(request, token, now) for request, token in zip(sampled, tokens)]

    def _accept(self, request: _Request, token: int | None, now: float) -> RequestOutput:
        """Append a sampled token, produce its text, and end the request if a stop condition fired."""
        seq = request.seq
        if token is None:
            return self._end(request, "failed", detail="the hard constraints mask every token")
        seq.output_ids.append(token)
        if request.lifecycle.state is RequestState.PREFILL:
            request.lifecycle.transition(RequestState.DECODE, now)
        try:
            reason, delta = self._new_text(request, token)
        except Exception as exc:  # e.g. the tokenizer cannot decode: this request fails, the others go on
            return self._end(request, "failed", detail=repr(exc))
        request.text += delta
        if reason is not None:
            return self._end(request, reason, delta=delta)
        return self._output(request, delta, self._release_ids(request, now))

    def _new_text(self, request: _Request, token: int) -> tuple[str | None, str]:
        """The stop condition that ``token`` fired (None if none) and the text now safe to send."""
        seq = request.seq
        if token == self._eos and not seq.params.ignore_eos:
            return "eos", ""
        delta = request.stops.push(request.detok.update(seq.output_ids))
        request.token_ends.append(len(request.detok.text))
        if request.stops.finished:
            return "stop", delta
        if len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length", delta
        return None, delta

    @staticmethod
    def _release_ids(request: _Request, now: float, partial: bool = False) -> tuple[int, ...]:
        """Hand out the token ids whose text has reached the caller (``partial``: also those cut by a stop
        string), stamping their emit time. An id whose text is still held back waits with it."""
        released, new = len(request.text), []
        while len(request.emitted_ids) < len(request.token_ends):
            i = len(request.emitted_ids)
            start = request.token_ends[i - 1] if i else 0
            if not (request.token_ends[i] <= released or (partial and start < released)):
                break
            request.emitted_ids.append(request.seq.output_ids[i])
            request.seq.times.emits.append(now)
            new.append(request.seq.output_ids[i])
        return tuple(new)

    def _expire_deadlines(self, now: float) -> list[RequestOutput]:
        expired = [r for r in self._requests.values() if r.seq.deadline is not None and now >= r.seq.deadline]
        return [self._end(r, "timed_out") for r in expired]

    def _apply_transitions(self, sched: SchedulerOutput, now: float) -> None:
        """Mirror the tick's decisions in each request's lifecycle (in the order they happened)."""
        for seq_id in sched.swapped_in:
            request = self._requests[seq_id]
            resumed = RequestState.DECODE if request.seq.output_ids else RequestState.PREFILL
            request.lifecycle.transition(resumed, now)
        for seq_id in sched.preempted:
            self._requests[seq_id].lifecycle.transition(RequestState.PREEMPTED, now)
        for seq_id in sched.swapped_out:
            self._requests[seq_id].lifecycle.transition(RequestState.SWAPPED, now)
        for seq_id in sched.admitted:
            self._requests[seq_id].lifecycle.transition(RequestState.PREFILL, now)

    # ------------------------------------------------------------------------------------------ the end

    def _end(self, request: _Request, reason: str, delta: str = "", detail: str = "") -> RequestOutput:
        """The one terminal path: settle the text, reclaim every resource, write the terminal record.

        A normal end (length, EOS) releases the text held back for a possible stop string; a stop match
        releases the ids of tokens its text reaches into; cancelled, timed-out and failed requests drop
        whatever was still held (the client never sees it).
        """
        seq = request.seq
        now = self.clock()
        if reason in ("length", "eos"):
            tail = request.stops.push(request.detok.update(seq.output_ids[:len(request.token_ends)], final=True))
            tail += request.stops.flush()
            request.text += tail
            delta += tail
            request.token_ends = [min(end, len(request.text)) for end in request.token_ends]
        delta_ids = self._release_ids(request, now, partial=reason == "stop") if reason in (
            "length", "eos", "stop") else ()
        request.finish_reason = reason
        request.committed_at_end = seq.num_computed
        seq.times.finish = now
        usage = Usage(prompt_tokens=len(seq.prompt_ids), generated_tokens=len(seq.output_ids),
                      emitted_tokens=len(request.emitted_ids))
        reclaim(request.lifecycle, _TERMINAL_STATE[reason], ledger=self.ledger, at=now,
                reason=f"{reason}: {detail}" if detail else reason, allocator=self.allocator,
                seq_ids=[seq.seq_id], slots=self.slots, host_swap=self.runner.host_swap, usage=usage)
        self.scheduler.drop(seq)
        del self._requests[seq.seq_id]
        return self._output(request, delta, delta_ids)

    def _output(self, request: _Request, delta: str, delta_ids: tuple[int, ...]) -> RequestOutput:
        seq = request.seq
        finished = request.finish_reason is not None
        return RequestOutput(
            request_id=seq.seq_id, delta=delta, text=request.text, delta_token_ids=tuple(delta_ids),
            token_ids=tuple(request.emitted_ids), finished=finished, finish_reason=request.finish_reason,
            usage=TokenUsage(prompt_tokens=len(seq.prompt_ids), cached_prompt_tokens=seq.num_cached_prompt or 0,
                             generated=len(seq.output_ids), emitted=len(request.emitted_ids),
                             committed=request.committed_at_end if finished else seq.num_computed),
            timing=self._timing(seq) if finished else None)

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
        if params.n != 1:
            raise ValueError(f"params.n must be 1 (submit n requests for n samples), got {params.n}")
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

    def _live(self, request_id: str) -> _Request | None:
        """The request if it has not ended; None if it has; KeyError for an id this engine never issued."""
        request = self._requests.get(request_id)
        if request is None and not self.ledger.has(request_id):
            raise KeyError(f"request_id {request_id!r} is unknown to this engine")
        return request

    def _id_in_use(self, request_id: str) -> bool:
        return request_id in self._requests or self.ledger.has(request_id)

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
