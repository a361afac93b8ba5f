"""``LLMEngine``: requests in, streamed text out, one scheduler tick + forward pass per :meth:`step`.

A step is five named phases: **schedule** (one scheduler tick: admissions under the reservation policy,
preemptions, swaps, token budget) -> **prepare inputs** (the tick's chunks as one flat
:class:`~servelab.engine.model_runner.ForwardInput`) -> **forward** (one pass, logits for the rows that
sample) -> **sample** (the batched sampler) -> **process outputs** (text, stop strings, EOS / length,
via :mod:`servelab.engine.outputs`), with expired deadlines ended first and one trace record last.

Every terminal path (finished, cancelled, timed out, failed) goes through :meth:`LLMEngine._end`, which
calls the one reclaim routine of ``servelab.lifecycle``: it frees the KV blocks, reservation, batch slot
and host swap space and writes the request's single terminal record to :attr:`LLMEngine.ledger`.

Parallel sampling (``params.n > 1``): the prompt is prefilled once, by sample 0's sequence, which holds a
batch slot for each sibling from admission on. When its last prompt chunk has run, the engine forks it
(``Scheduler.fork`` -> ``BlockAllocator.fork``): every sibling shares the prompt's blocks (refcount n),
each sample draws its first token from the same last-position logits with its own generator (seed + i),
and the first write into the shared partial tail is copied on write. A sample that finishes while
siblings go on returns its blocks and slot at once; the request ends when the last sample does.

Cancel, pause / resume (a third kind of preemption: compute freed, KV kept), ``stream`` and ``generate``
live in :mod:`servelab.engine.control`. System boundary: timestamps come from the injected ``clock``
(seconds) at the engine API: arrival is ``add_request``, an emit is the end of the step that hands a token
to the caller; what is in front of the engine (network, HTTP, queueing) is outside.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch

from servelab.chat_template import ChatTemplate
from servelab.engine.config import EngineConfig
from servelab.engine.control import EngineStats, RequestControls
from servelab.engine.model_runner import ForwardInput, ModelRunner, resolve_device_dtype
from servelab.engine.outputs import (RequestOutput, SampleOutput, SampleStream, TokenUsage, accept_token,
                                     request_output, settle)
from servelab.engine.request import FINISH_REASONS, TERMINAL_STATE, EngineRequest, new_request
from servelab.engine.sampler import SamplingRow, sample_tokens
from servelab.engine.scheduler import Scheduler, SchedulerOutput
from servelab.engine.trace import StepRecord
from servelab.engine.validation import RequestValidator, check_components, context_limit
from servelab.kv import BlockAllocator
from servelab.lifecycle import Ledger, RequestState, SlotPool, Usage, reclaim
from servelab.model.llama import LlamaForCausalLM
from servelab.sampling import SamplingParams

__all__ = ["FINISH_REASONS", "EngineStats", "LLMEngine", "RequestOutput", "SampleOutput", "TokenUsage"]


class LLMEngine(RequestControls):
    """A small continuous-batching engine over a paged KV cache. See the module docstring."""

    chat_template: ChatTemplate | None = None  # the checkpoint's, set by from_pretrained; None: it has none

    def __init__(self, model: LlamaForCausalLM, tokenizer, config: EngineConfig | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        config = check_components(model, tokenizer, EngineConfig() if config is None else config)
        self.config = config
        self.tokenizer = tokenizer
        self.clock = clock
        self.max_model_len = context_limit(model, config)
        self.runner = ModelRunner(model, config)
        # cache_on_compute: a block enters the prefix cache only once the scheduler commits its KV
        self.allocator = BlockAllocator(self.runner.num_blocks, config.block_size, config.enable_prefix_caching,
                                        cache_on_compute=True)
        self.slots = SlotPool(config.max_num_seqs)
        self.scheduler = Scheduler(config, self.allocator, self.runner, self.slots, self.max_model_len)
        self.validator = RequestValidator(tokenizer, model.config.vocab_size, self.max_model_len, config,
                                          self.runner.num_blocks, self.scheduler.reservation)
        self.ledger = Ledger()
        self.trace: list[StepRecord] = []
        self.last_schedule: SchedulerOutput | None = None  # the most recent scheduler tick, for inspection
        self._requests: dict[str, EngineRequest] = {}
        self._samples: dict[str, SampleStream] = {}  # by sequence id: every sample of every live request
        self._pending: list[RequestOutput] = []  # final outputs of requests ended between steps
        self._arrivals = itertools.count()
        self._seed_rng = random.Random(config.seed)
        self._eos = frozenset(model.config.eos_token_ids)  # every id in config.json / generation_config.json

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
        Checks: :class:`~servelab.engine.validation.RequestValidator`.
        """
        arrival = self.clock()
        prompt_ids = self.validator.prompt_ids(prompt)
        self.validator.check_params(params, prompt_ids)
        request_id = self.validator.request_id(request_id, self._id_in_use)
        self.validator.check_options(deadline_s, namespace, priority)
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(63)
        arrival_index = next(self._arrivals)
        request = new_request(request_id, self.validator.sample_ids(request_id, params.n, self._id_in_use),
                              prompt_ids, params, tokenizer=self.tokenizer, arrival=arrival,
                              arrival_index=arrival_index, seed=seed, namespace=namespace, priority=priority,
                              deadline=None if deadline_s is None else arrival + deadline_s)
        self._requests[request_id] = request
        self._samples.update((s.seq.seq_id, s) for s in request.samples)
        self.scheduler.add(request.seq)  # the siblings join when it forks, after its prompt
        return request_id

    def has_unfinished(self) -> bool:
        """True while some request has not ended (or an ended one's final output is not yet returned)."""
        return bool(self._requests or self._pending)

    def step(self) -> list[RequestOutput]:
        """Run one iteration; returns the outputs (deltas) it produced, finished requests included.

        Phases: schedule -> prepare inputs -> forward -> sample -> process outputs (:meth:`_run`).
        A step in which nothing happened returns ``[]`` and leaves no trace record.
        """
        record = StepRecord(step=len(self.trace), start=self.clock())
        outputs, self._pending = self._pending, []
        outputs += self._expire_deadlines(record.start)
        sched = self._schedule(record.start)
        outputs += self._fail_unschedulable() if sched.is_empty else self._run(sched, record)
        if sched.is_empty and not (outputs or sched.preempted or sched.swapped_out or sched.swapped_in):
            return outputs
        finished = {o.request_id: o.finish_reason for o in outputs if o.finished}
        record.close(sched, self.allocator, self.scheduler, finished, self.clock())
        self.trace.append(record)
        return outputs

    # ------------------------------------------------------------------------------------------ the phases

    def _schedule(self, now: float) -> SchedulerOutput:
        """Phase 1: one scheduler tick, mirrored in the lifecycle of each request it moved."""
        sched = self.last_schedule = self.scheduler.schedule()
        self._apply_transitions(sched, now)
        return sched

    def _run(self, sched: SchedulerOutput, record: StepRecord) -> list[RequestOutput]:
        """Phases 2-5 of a non-empty tick. A failing forward pass fails every request in the batch, a
        failing sampler every sampled one; either way through the one terminal path, nothing leaks."""
        batch = self._prepare_inputs(sched, record)
        try:
            logits = self.runner.execute(batch)
        except Exception as exc:
            return self._fail([self._samples[c.seq_id] for c in sched.chunks], exc)
        for chunk in sched.chunks:  # the KV of every chunk is now in the pool
            self.scheduler.commit(chunk, self._samples[chunk.seq_id].seq)
        picks = self._fork_finished_prompts([self._samples[c.seq_id] for c in sched.chunks if c.sample])
        try:
            tokens = self._sample(logits, picks)
        except Exception as exc:
            return self._fail([stream for stream, _ in picks], exc)
        return self._process_outputs([stream for stream, _ in picks], tokens)

    def _prepare_inputs(self, sched: SchedulerOutput, record: StepRecord) -> ForwardInput:
        """Phase 2: the tick's chunks as one flat batch; the trace records what each chunk computes."""
        rows = []
        for chunk in sched.chunks:
            seq = self._samples[chunk.seq_id].seq
            record.add_chunk(chunk, len(seq.prompt_ids))
            if seq.times.first_scheduled is None:
                seq.times.first_scheduled = record.start
            rows.append((chunk, seq, self.allocator.block_table(chunk.seq_id)))
        return ForwardInput.from_chunks(rows)

    def _sample(self, logits: torch.Tensor, picks: list[tuple[SampleStream, int]]) -> list[int | None]:
        """Phase 4: one token per picked sample, drawn from its logits row (forked samples share one)."""
        if len(picks) != logits.shape[0]:
            logits = logits[torch.tensor([row for _, row in picks], device=logits.device)]
        return sample_tokens(logits, [SamplingRow(s.seq.params, s.seq.prompt_ids, s.seq.output_ids, s.seq.generator)
                                      for s, _ in picks])

    def _process_outputs(self, streams: list[SampleStream], tokens: list[int | None]) -> list[RequestOutput]:
        """Phase 5: each sampled token becomes text and maybe a stop; one output per sampled request.
        A sample that fails (masked vocabulary, undecodable text) fails its whole request."""
        now = self.clock()
        stops: dict[EngineRequest, list[tuple[SampleStream, str]]] = {}  # every sampled request, batch order
        failures: dict[EngineRequest, str] = {}
        for stream, token in zip(streams, tokens):
            request = self._requests[stream.request_id]
            stops.setdefault(request, [])
            if request in failures:  # a sibling already failed it: the whole request ends
                continue
            if token is not None and request.lifecycle.state is RequestState.PREFILL:
                request.lifecycle.transition(RequestState.DECODE, now)
            reason, detail = accept_token(stream, token, now, self._eos, self.max_model_len)
            if reason == "failed":
                failures[request] = detail
            elif reason is not None:
                stops[request].append((stream, reason))
        return [self._conclude(r, stops[r], failures.get(r)) for r in stops]

    def _fork_finished_prompts(self, sampled: list[SampleStream]) -> list[tuple[SampleStream, int]]:
        """Fork each request whose prompt just got computed into its ``n`` samples.

        Returns the samples to draw a token for, each with the logits row it draws from: a forked
        request's samples all read the row of its last prompt position.
        """
        picks: list[tuple[SampleStream, int]] = []
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

    def _conclude(self, request: EngineRequest, stops: list[tuple[SampleStream, str]],
                  failure: str | None) -> RequestOutput:
        """This step's output for a request with sampled tokens: settle the samples that stopped, free
        their KV early when siblings go on, and end the request once no sample is left."""
        if failure is not None:
            return self._end(request, "failed", detail=failure)
        if not stops:
            return request_output(request.request_id, request.samples, request.finish_reason)
        now = self.clock()
        for stream, reason in stops:
            settle(stream, reason, now)
        if all(s.finish_reason is not None for s in request.samples):
            return self._end(request, stops[-1][1], at=now)
        for stream, _ in stops:  # siblings still decode: its blocks, reservation and slot go back now
            self.scheduler.drop(stream.seq)
            self.allocator.free(stream.seq.seq_id)
            self.slots.release(stream.seq.seq_id)
        return request_output(request.request_id, request.samples, request.finish_reason)

    def _apply_transitions(self, sched: SchedulerOutput, now: float) -> None:
        """Mirror the tick's decisions in each request's lifecycle (in the order they happened).

        After the fork the lifecycle stays in DECODE while any sample runs: a sample's own preemption
        shows in the trace, not in the request's state.
        """
        def unforked(seq_ids: list[str]) -> list[EngineRequest]:
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

    def _expire_deadlines(self, now: float) -> list[RequestOutput]:
        expired = [r for r in self._requests.values() if r.seq.deadline is not None and now >= r.seq.deadline]
        return [self._end(r, "timed_out") for r in expired]

    def _fail_unschedulable(self) -> list[RequestOutput]:
        """An idle engine that cannot admit its first waiting request never will: fail it, not hang."""
        ready = [seq for seq in self.scheduler.waiting if not seq.paused]
        if not ready or self.scheduler.running or self.scheduler.swapped:
            return []
        stuck = self._request_of(min(ready, key=self.scheduler.key).seq_id)
        return [self._end(stuck, "failed", detail="cannot be scheduled even on an idle engine")]

    def _fail(self, streams: list[SampleStream], exc: Exception) -> list[RequestOutput]:
        """End every request that ``streams`` sample for as failed, with the exception as the detail."""
        requests = dict.fromkeys(self._requests[s.request_id] for s in streams)
        return [self._end(r, "failed", detail=repr(exc)) for r in requests]

    def _end(self, request: EngineRequest, reason: str, detail: str = "", at: float | None = None) -> RequestOutput:
        """The one terminal path: settle every unfinished sample with ``reason``, reclaim every resource
        of every sample's sequence in one ``reclaim`` call, write the terminal record.

        ``at`` is the end time when the caller already read the clock for it.
        """
        now = self.clock() if at is None else at
        for stream in request.samples:
            if stream.finish_reason is None:
                settle(stream, reason, now)
        request.finish_reason = reason
        seqs = [s.seq for s in request.samples]
        usage = Usage(prompt_tokens=len(seqs[0].prompt_ids), generated_tokens=sum(len(q.output_ids) for q in seqs),
                      emitted_tokens=sum(len(s.emitted_ids) for s in request.samples))
        reclaim(request.lifecycle, TERMINAL_STATE[reason], ledger=self.ledger, at=now,
                reason=f"{reason}: {detail}" if detail else reason, allocator=self.allocator,
                seq_ids=[q.seq_id for q in seqs], slots=self.slots, host_swap=self.runner.host_swap, usage=usage)
        for seq in seqs:
            self.scheduler.drop(seq)
            del self._samples[seq.seq_id]
        del self._requests[request.request_id]
        return request_output(request.request_id, request.samples, reason)

    # ------------------------------------------------------------------------------------------ helpers

    def _request_of(self, seq_id: str) -> EngineRequest:
        """The live request that sequence ``seq_id`` samples for."""
        return self._requests[self._samples[seq_id].request_id]

    def _live(self, request_id: str) -> EngineRequest | None:
        """The request if it has not ended; None if it has; KeyError for an id this engine never issued."""
        request = self._requests.get(request_id)
        if request is None and not self.ledger.has(request_id):
            raise KeyError(f"request_id {request_id!r} is unknown to this engine")
        return request

    def _id_in_use(self, request_id: str) -> bool:
        return request_id in self._requests or request_id in self._samples or self.ledger.has(request_id)
