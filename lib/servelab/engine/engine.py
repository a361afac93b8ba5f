"""``LLMEngine``: requests in, streamed text out, one scheduler tick + forward pass per :meth:`step`.

A step is five named phases: **schedule** (one scheduler tick: admissions under the reservation policy,
preemptions, swaps, token budget) -> **prepare inputs** (the tick's chunks as one flat
:class:`~servelab.engine.model_runner.ForwardInput`) -> **forward** (one pass, logits for the rows that
sample) -> **sample** (the batched sampler) -> **process outputs** (text, stop strings, EOS / length,
via :mod:`servelab.engine.outputs`), with expired deadlines ended first and, when tracing is on, one trace record last.

Every terminal path (finished, cancelled, timed out, failed) goes through :meth:`LLMEngine._end`: each
of the request's sequences goes back through the one release path, ``Scheduler.release`` (KV blocks,
reservation, batch slot, host swap copy), and the request's single terminal record is written to
:attr:`LLMEngine.ledger`. A sample that finishes while its siblings go on is released the same way.

Parallel sampling (``params.n > 1``): the prompt is prefilled once, by sample 0's sequence, which holds a
batch slot for each sibling from admission on. When its last prompt chunk has run, the engine forks it
(``Scheduler.fork`` -> ``BlockAllocator.fork``): every sibling shares the prompt's blocks (refcount n),
each sample draws its first token from the same last-position logits with its own generator (seed + i),
and the first write into the shared partial tail is copied on write. A sample that finishes while
siblings go on is released at once; the request ends when the last sample does.

Logprobs (``params.logprobs`` / ``params.prompt_logprobs``): the raw model's log-softmax of the rows the
forward pass already computed (:func:`~servelab.engine.sampler.token_logprobs`): a sampled row for each
generated token, and, for prompt logprobs, the prefill's other prompt positions as extra LM-head rows of
the same pass. A request with prompt logprobs is admitted under a namespace of its own, so no prefix hit
skips a position it has to score (its own recompute after a preemption keeps the scores it has).

Cancel and pause / resume (a third kind of preemption: compute freed, KV kept) are methods here; the
``stream`` and ``generate`` drivers live in :mod:`servelab.engine.control`. Tracing
(``EngineConfig.trace_steps``) keeps a ring buffer of per-step records in :attr:`LLMEngine.trace`; off,
a step builds none. System boundary: timestamps come from the injected ``clock`` (seconds) at the
engine API: arrival is ``add_request``, an emit is the end of the step that hands a token to the
caller; what is in front of the engine (network, HTTP, queueing) is outside.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence as SequenceOf
from pathlib import Path
from types import MappingProxyType

import torch

from servelab import grammar
from servelab.chat_template import ChatTemplate
from servelab.engine.config import EngineConfig
from servelab.engine import control
from servelab.engine.control import EngineStats
from servelab.engine.model_runner import ForwardInput, ModelRunner, resolve_device_dtype
from servelab.engine.outputs import (RequestOutput, SampleOutput, StepOutputs, accept_token, request_output, finish_text,
                                     usage)
from servelab.engine.request import FINISH_REASONS, TERMINAL_STATE, EngineRequest, lifecycle_state, new_request
from servelab.engine.sampler import SamplingRow, sample_tokens, token_logprobs
from servelab.engine.scheduler import Scheduler, SchedulerOutput
from servelab.engine.sequence import Sequence
from servelab.engine.trace import StepRecord
from servelab.engine.validation import RequestValidator, check_components, context_limit
from servelab.kv.allocator import BlockAllocator
from servelab.ledger import Ledger, TerminalRecord, Usage
from servelab.lifecycle import RequestState, SlotPool
from servelab.model.llama import LlamaForCausalLM
from servelab.sampling.params import SamplingParams

__all__ = ["FINISH_REASONS", "EngineStats", "LLMEngine", "RequestOutput", "SampleOutput", "Usage"]


class LLMEngine:
    """A small continuous-batching engine over a paged KV cache. See the module docstring."""

    chat_template: ChatTemplate | None = None  # the checkpoint's, set by from_pretrained; None: it has none
    # generation_config.json's temperature / top_p / top_k / min_p / repetition_penalty, set by from_pretrained
    default_sampling: Mapping[str, float | int] = MappingProxyType({})

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
        self.ledger = Ledger(max_records=config.ledger_size)
        self.trace: deque[StepRecord] = deque(maxlen=config.trace_steps)  # stays empty when tracing is off
        self.last_schedule: SchedulerOutput | None = None  # the most recent scheduler tick, for inspection
        self.num_steps = 0  # steps in which something happened (the trace's step numbers)
        self._requests: dict[str, EngineRequest] = {}  # live requests; each sequence points to its own
        self._pending: list[RequestOutput] = []  # final outputs of requests ended between steps
        self._arrivals = itertools.count()
        self._seed_rng = random.Random(config.seed)
        self._eos = frozenset(model.config.eos_token_ids)  # every id in config.json / generation_config.json

    @classmethod
    def from_pretrained(cls, path_or_id: str | Path | None = None, *, allow_download: bool = False,
                        device: str | None = None, dtype: str | None = None,
                        clock: Callable[[], float] = time.perf_counter, **config) -> "LLMEngine":
        """An engine over a Llama checkpoint folder (default: the shipped Shakespeare model) with its
        tokenizer, chat template (:attr:`chat_template`) and default sampling settings
        (:attr:`default_sampling`, from ``generation_config.json``: see :meth:`sampling_params`), or over a Hugging Face Hub id such as
        ``"HuggingFaceTB/SmolLM2-135M-Instruct"`` when ``allow_download=True`` (never by default).

        ``device`` / ``dtype`` default to :func:`servelab.device.pick_device`; other keyword arguments are
        :class:`EngineConfig` fields. See :mod:`servelab.model.pretrained`.
        """
        from servelab.model.pretrained import load_pretrained

        engine_config = EngineConfig(device=device, dtype=dtype, **config)
        where, precision = resolve_device_dtype(engine_config)
        model, tokenizer, template, defaults = load_pretrained(path_or_id, allow_download=allow_download,
                                                               device=where, dtype=precision)
        engine = cls(model, tokenizer, engine_config, clock=clock)
        engine.chat_template = template
        engine.default_sampling = MappingProxyType(defaults)
        return engine

    def sampling_params(self, **fields) -> SamplingParams:
        """:class:`SamplingParams` of ``fields`` over the checkpoint's :attr:`default_sampling`: a field
        given here keeps its value, one left out takes ``generation_config.json``'s, else the course default
        (:mod:`servelab.model.generation_config` lists the fields read)."""
        return SamplingParams(**(dict(self.default_sampling) | fields))

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
        if params.prompt_logprobs is not None:  # a namespace of its own: no prefix hit skips a scored position
            namespace = f"{namespace}\x00prompt-logprobs:{request_id}"
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(63)
        arrival_index = next(self._arrivals)
        request = new_request(request_id, self.validator.sample_ids(request_id, params.n, self._id_in_use),
                              prompt_ids, params, tokenizer=self.tokenizer, arrival=arrival,
                              arrival_index=arrival_index, seed=seed, namespace=namespace, priority=priority,
                              deadline=None if deadline_s is None else arrival + deadline_s)
        self._requests[request_id] = request
        self.scheduler.add(request.seq)  # the siblings join when it forks, after its prompt
        return request_id

    def state(self, request_id: str) -> RequestState:
        """The request's lifecycle state now (``servelab.lifecycle.RequestState``): read off the
        scheduler's state of its sequences while it runs, its terminal record's once it has ended.
        KeyError for an id this engine does not know: never issued, or ended more than
        ``config.ledger_size`` requests ago (its record left the ledger's window)."""
        request = self._requests.get(request_id)
        if request is not None:
            return lifecycle_state(request)
        return self.ledger.get(request_id).state

    def has_unfinished(self) -> bool:
        """True while some request has not ended (or an ended one's final output is not yet returned)."""
        return bool(self._requests or self._pending)

    def step(self) -> StepOutputs:
        """Run one iteration; returns the outputs (deltas) it produced, finished requests included, as a
        list that also names the requests admitted and counts the sequences preempted this step.

        Phases: schedule -> prepare inputs -> forward -> sample -> process outputs (:meth:`_run`).
        A step in which nothing happened returns an empty list and leaves no trace record.
        """
        start = self.clock()
        record = StepRecord(step=self.num_steps, start=start) if self.config.trace_steps else None
        outputs, self._pending = self._pending, []
        outputs += self._expire_deadlines(start)
        sched = self.last_schedule = self.scheduler.schedule()
        outputs += self._fail_unschedulable() if sched.is_empty else self._run(sched, start, record)
        if sched.is_empty and not (outputs or sched.preempted or sched.swapped_out or sched.swapped_in):
            return StepOutputs(outputs)
        self.num_steps += 1
        if record is not None:
            finished = {o.request_id: o.finish_reason for o in outputs if o.finished}
            record.close(sched, self.allocator, self.scheduler, finished, self.clock())
            self.trace.append(record)
        admitted = set(sched.admitted)
        return StepOutputs(outputs, tuple(dict.fromkeys(c.seq.request.request_id for c in sched.chunks
                                                        if c.seq_id in admitted)),
                           len(sched.preempted) + len(sched.swapped_out), sched.num_batched_tokens)

    # ------------------------------------------------------------------------------------------ controls

    def stats(self) -> EngineStats:
        """Sequences running, waiting and swapped out now, the KV pool's used fraction (what the server's
        ``/metrics`` and its queue limit read: public questions, not the scheduler's lists), and the exact
        totals of every ended request (the ledger's, not its bounded window)."""
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting), len(self.scheduler.swapped),
                           self.allocator.num_used_blocks / self.allocator.num_blocks, self.ledger.totals())

    def cancel(self, request_id: str) -> bool:
        """Cancel a request; its final output (``finish_reason="cancelled"``) comes from the next step.

        Returns False when it had already ended. Raises KeyError for an id this engine does not know (never
        issued, or its record left the ledger's window).
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
        is in BACKPRESSURED (the lifecycle's paused-with-KV state) while paused; in other stages its
        lifecycle state stays. Its deadline still runs and :meth:`cancel` still works, both through the one reclaim path.
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

    def abort(self, request_id: str) -> bool:
        """:meth:`cancel` whose final output is dropped instead of returned (the caller is gone)."""
        if not self.cancel(request_id):
            return False
        self._pending = [o for o in self._pending if o.request_id != request_id]
        return True

    def stream(self, prompt: str | list[int], params: SamplingParams, **kwargs) -> Iterator[str]:
        """Yield the text deltas of one new request as steps produce them (see :func:`control.stream`)."""
        return control.stream(self, prompt, params, **kwargs)

    def generate(self, prompts: SequenceOf[str | list[int]] | str,
                 params: SamplingParams | SequenceOf[SamplingParams]) -> list[RequestOutput]:
        """Offline batch: run all ``prompts`` to completion; each one's final output, in order
        (see :func:`control.generate`)."""
        return control.generate(self, prompts, params)

    def _set_paused(self, request_id: str, paused: bool) -> bool:
        """Flag every sample of a live request (its lifecycle state, DECODE <-> BACKPRESSURED, follows)."""
        request = self._live(request_id)
        if request is None:
            return False
        for seq in request.seqs:
            seq.paused = paused
        return True

    # ------------------------------------------------------------------------------------------ the phases

    def _run(self, sched: SchedulerOutput, start: float, record: StepRecord | None) -> list[RequestOutput]:
        """Phases 2-5 of a non-empty tick. A failing forward pass fails every request in the batch, a
        failing sampler every sampled one; either way through the one terminal path, nothing leaks."""
        batch = self._prepare_inputs(sched, start, record)
        try:
            logits = self.runner.execute(batch)
        except Exception as exc:
            return self._fail([c.seq for c in sched.chunks], exc)
        for chunk in sched.chunks:  # the KV of every chunk is now in the pool
            self.scheduler.commit(chunk)
        logits, score_logits = logits[:len(batch.sample_indices)], logits[len(batch.sample_indices):]
        picks = self._fork_finished_prompts([c.seq for c in sched.chunks if c.emits_token])
        try:
            self._score_prompts(batch.score_rows, score_logits)
            tokens = self._sample(logits, picks)
        except Exception as exc:
            return self._fail([seq for seq, _ in picks], exc)
        return self._process_outputs([seq for seq, _ in picks], tokens)

    def _prepare_inputs(self, sched: SchedulerOutput, start: float, record: StepRecord | None) -> ForwardInput:
        """Phase 2: the tick's chunks as one flat batch; the trace (when on) records what each computes."""
        rows = []
        for chunk in sched.chunks:
            seq = chunk.seq
            if record is not None:
                record.add_chunk(chunk, len(seq.prompt_ids))
            if seq.times.first_scheduled is None:
                seq.times.first_scheduled = start
            rows.append((chunk, seq, self.allocator.block_table(seq.seq_id)))
        return ForwardInput.from_chunks(rows)

    def _sample(self, logits: torch.Tensor, picks: list[tuple[Sequence, int]]) -> list[int | None]:
        """Phase 4: one token per picked sample, drawn from its logits row (forked samples share one)."""
        if len(picks) != logits.shape[0]:
            logits = logits[torch.tensor([row for _, row in picks], device=logits.device)]
        masks = self._grammar_masks([s for s, _ in picks], logits.shape[-1])
        tokens = sample_tokens(logits, [SamplingRow(s.params, s.prompt_ids, s.output_ids, s.generator, masks.get(i))
                                        for i, (s, _) in enumerate(picks)])
        for i, (seq, _) in enumerate(picks):
            if i in masks and tokens[i] is not None:
                grammar.accept(seq.matcher, tokens[i])
        wanted = [i for i, (s, _) in enumerate(picks) if s.params.logprobs is not None and tokens[i] is not None]
        if wanted:  # the raw distribution of the same rows, for the tokens just drawn
            found = token_logprobs(logits[torch.tensor(wanted, device=logits.device)], [tokens[i] for i in wanted],
                                   [picks[i][0].params.logprobs for i in wanted])
            for i, logprob in zip(wanted, found):
                picks[i][0].logprobs.append(logprob)
        return tokens

    def _grammar_masks(self, seqs: list[Sequence], vocab_size: int) -> dict[int, torch.Tensor]:
        """Row -> the ids its grammar allows next, for the rows whose request has ``params.grammar``."""
        rows = [i for i, s in enumerate(seqs) if s.params.grammar is not None]
        if not rows:
            return {}
        for i in rows:
            if seqs[i].matcher is None:
                seqs[i].matcher = grammar.new_matcher(seqs[i].params.grammar)
        masks = grammar.allowed_masks([seqs[i].matcher for i in rows], vocab_size)
        return dict(zip(rows, masks))

    def _score_prompts(self, rows: list[tuple[Sequence, int]], logits: torch.Tensor) -> None:
        """Store the prompt logprobs of this step's score rows (``(sequence, position)`` each, scoring prompt
        token ``position + 1``); a position scored before (a recomputed prefill) is skipped."""
        if not rows:
            return
        found = token_logprobs(logits, [seq.prompt_ids[p + 1] for seq, p in rows],
                               [seq.params.prompt_logprobs for seq, _ in rows])
        for (seq, position), logprob in zip(rows, found):
            if position == len(seq.prompt_logprobs):
                seq.prompt_logprobs.append(logprob)

    def _process_outputs(self, seqs: list[Sequence], tokens: list[int | None]) -> list[RequestOutput]:
        """Phase 5: each sampled token becomes text and maybe a stop; one output per sampled request.
        A sample that fails (masked vocabulary, undecodable text) fails its whole request."""
        now = self.clock()
        stops: dict[EngineRequest, list[tuple[Sequence, str]]] = {}  # every sampled request, batch order
        failures: dict[EngineRequest, str] = {}
        for seq, token in zip(seqs, tokens):
            request = seq.request
            stops.setdefault(request, [])
            if request in failures:  # a sibling already failed it: the whole request ends
                continue
            reason, detail = accept_token(seq, token, now, self._eos, self.max_model_len)
            if reason == "failed":
                failures[request] = detail
            elif reason is not None:
                stops[request].append((seq, reason))
        return [self._finish_stopped(r, stops[r], failures.get(r)) for r in stops]

    def _fork_finished_prompts(self, sampled: list[Sequence]) -> list[tuple[Sequence, int]]:
        """Fork each request whose prompt just got computed into its ``n`` samples.

        Returns the samples to draw a token for, each with the logits row it draws from: a forked
        request's samples all read the row of its last prompt position.
        """
        picks: list[tuple[Sequence, int]] = []
        for row, seq in enumerate(sampled):
            request = seq.request
            if len(request.seqs) > 1 and not request.forked:
                siblings = request.seqs[1:]
                self.scheduler.fork(seq, siblings)
                for sibling in siblings:
                    sibling.times.first_scheduled = seq.times.first_scheduled
                request.forked = True
                picks += [(s, row) for s in request.seqs]
            else:
                picks.append((seq, row))
        return picks

    def _finish_stopped(self, request: EngineRequest, stops: list[tuple[Sequence, str]],
                  failure: str | None) -> RequestOutput:
        """This step's output for a request with sampled tokens: finish the text of the samples that stopped, release
        them early when siblings go on, and end the request once no sample is left."""
        if failure is not None:
            return self._end(request, "failed", detail=failure)
        if not stops:
            return request_output(request.request_id, request.seqs, request.finish_reason)
        now = self.clock()
        for seq, reason in stops:
            finish_text(seq, reason, now)
        if all(s.finish_reason is not None for s in request.seqs):
            return self._end(request, stops[-1][1], at=now)
        for seq, _ in stops:  # siblings still decode: its blocks, reservation and slot go back now
            self.scheduler.release(seq)
        return request_output(request.request_id, request.seqs, request.finish_reason)

    # ------------------------------------------------------------------------------------------ the end

    def _expire_deadlines(self, now: float) -> list[RequestOutput]:
        expired = [r for r in self._requests.values() if r.seq.deadline is not None and now >= r.seq.deadline]
        return [self._end(r, "timed_out") for r in expired]

    def _fail_unschedulable(self) -> list[RequestOutput]:
        """An idle engine that cannot admit its first waiting request never will: fail it, not hang."""
        ready = [seq for seq in self.scheduler.waiting if not seq.paused]
        if not ready or self.scheduler.running or self.scheduler.swapped:
            return []
        stuck = min(ready, key=self.scheduler.key).request
        return [self._end(stuck, "failed", detail="cannot be scheduled even on an idle engine")]

    def _fail(self, seqs: list[Sequence], exc: Exception) -> list[RequestOutput]:
        """End every request that ``seqs`` sample for as failed, with the exception as the detail."""
        requests = dict.fromkeys(s.request for s in seqs)
        return [self._end(r, "failed", detail=repr(exc)) for r in requests]

    def _end(self, request: EngineRequest, reason: str, detail: str = "", at: float | None = None) -> RequestOutput:
        """The one terminal path: finish the text of every unfinished sample with ``reason``, release every sequence
        through ``Scheduler.release``, write the request's one terminal record, and let go of the sequences
        (``request.seqs`` is emptied, so the ended request and its sequences are freed as soon as nothing
        else holds them, not at the next full garbage collection).

        ``at`` is the end time when the caller already read the clock for it.
        """
        now = self.clock() if at is None else at
        from_state = lifecycle_state(request)
        for seq in request.seqs:
            if seq.finish_reason is None:
                finish_text(seq, reason, now)
        request.finish_reason = reason
        released = [self.scheduler.release(seq) for seq in request.seqs]
        self.ledger.append(TerminalRecord(
            request_id=request.request_id, state=TERMINAL_STATE[reason], reason=f"{reason}: {detail}" if detail else reason,
            at=now, usage=usage(request.seqs), from_state=from_state, blocks_freed=sum(r.blocks for r in released),
            reservation_released=sum(r.reservation for r in released), slots_released=sum(r.slots for r in released),
            swap_released=sum(r.swap for r in released)))
        del self._requests[request.request_id]
        output = request_output(request.request_id, request.seqs, reason)
        request.seqs = []  # break the request <-> sequence cycle: refcounting, not the cyclic GC, frees both
        return output

    # ------------------------------------------------------------------------------------------ helpers

    def _live(self, request_id: str) -> EngineRequest | None:
        """The request if it has not ended; None if it has (within the ledger's window); KeyError otherwise."""
        request = self._requests.get(request_id)
        if request is None and not self.ledger.has(request_id):
            raise KeyError(f"request_id {request_id!r} is unknown to this engine")
        return request

    def _id_in_use(self, seq_or_request_id: str) -> bool:
        """True for a live request's id, an ended one's still in the ledger's window (the last
        ``config.ledger_size``), and the sample sequence ids of a live request."""
        if seq_or_request_id in self._requests or self.ledger.has(seq_or_request_id):
            return True
        request = self._requests.get(seq_or_request_id.rpartition("/")[0])
        return request is not None and any(s.seq_id == seq_or_request_id for s in request.seqs)
