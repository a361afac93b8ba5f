"""``EngineCore.step`` (``LLMEngine.step``): one scheduler tick and one forward pass, as five named
phases.

**schedule** (:mod:`~servelab.engine.scheduler`) -> **prepare inputs** (the tick's chunks as one
flat :class:`~servelab.engine.model_runner.ForwardInput`) -> **forward** (logits for the rows that
sample) -> **sample** (:mod:`~servelab.engine.sampler`) -> **process outputs**
(:func:`~servelab.engine.sequence.accept_token`: text, stop strings, EOS / length). With
``speculative_config`` a decoding request brings proposals to the tick
(:mod:`~servelab.engine.spec_propose`), the forward pass scores them in the same batch, and phase 4
verifies them (:mod:`~servelab.engine.spec_verify`) and rolls the rejected ones' KV back. Every
ending (finished, cancelled, timed out, failed) goes through :meth:`EngineCore._end` and §0's
``reclaim``: every sequence's KV, slots and swap copy back, one terminal record in
:attr:`EngineCore.ledger`. :class:`EngineCore` owns the engine's state and its step;
:class:`~servelab.engine.llm_engine.LLMEngine`, its subclass, is the API a caller drives between
steps (load, add, cancel, pause / resume, stats).

System boundary: timestamps come from the injected ``clock`` (seconds) at the engine API: arrival is
``add_request``, an emit is the end of the step that hands a token to the caller.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Callable

import torch

from servelab.engine.config import EngineConfig
from servelab.engine import logprobs, structured
from servelab.engine.model_runner import ForwardInput, ModelRunner
from servelab.engine.parallel_sampling import fork_finished_prompts
from servelab.engine.request import FINISH_REASONS, TERMINAL_STATE, lifecycle_state
from servelab.engine.admission import reservation_policy
from servelab.engine.sampler import SamplingRow, sample_tokens
from servelab.engine.scheduler import ScheduledChunk, Scheduler, SchedulerOutput
from servelab.engine.sequence import (
    EngineRequest,
    RequestOutput,
    SampleOutput,
    EngineSequence,
    StepOutputs,
    accept_token,
    finish_text,
    request_output,
    usage,
)
from servelab.engine.spec_propose import make_proposer
from servelab.engine.spec_verify import SpecDecodingStats, verify
from servelab.engine.trace import StepRecord
from servelab.engine.validation import RequestValidator, check_components, context_limit
from servelab.kv.allocator import BlockAllocator
from servelab.lifecycle.ledger import Ledger, Usage
from servelab.lifecycle.state_machine import RequestLifecycle, SlotPool, reclaim
from servelab.model.llama import LlamaForCausalLM

__all__ = ["FINISH_REASONS", "EngineCore", "RequestOutput", "SampleOutput", "Usage"]

_log = logging.getLogger(__name__)


class EngineCore:
    """A small continuous-batching engine over a paged KV cache: its state and its step (see the
    module docstring). Built through :class:`~servelab.engine.llm_engine.LLMEngine`, which adds the
    caller's API."""

    def __init__(self, model: LlamaForCausalLM, tokenizer, config: EngineConfig | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        config = check_components(model, tokenizer, EngineConfig() if config is None else config)
        self.config = config
        self.tokenizer = tokenizer
        self.clock = clock
        self.max_model_len = context_limit(model, config)
        self.runner = ModelRunner(model, config)
        _log.info("%s", self.runner.pool_size.describe())
        # cache_on_compute: a block enters the prefix cache only once the scheduler commits its KV
        self.allocator = BlockAllocator(
            self.runner.num_blocks,
            config.block_size,
            config.enable_prefix_caching,
            cache_on_compute=True,
        )
        self.slots = SlotPool(config.max_num_seqs)
        reservation = reservation_policy(
            config.reservation_policy, config.block_size, self.max_model_len
        )
        self.proposer = make_proposer(
            config.speculative_config, self.runner.model, self.max_model_len
        )
        self.spec_stats = (None if self.proposer is None
                           else SpecDecodingStats(config.speculative_config.num_speculative_tokens))
        # seq id -> drafts accepted in the latest step (the trace's)
        self.last_accepted: dict[str, int] = {}
        self.scheduler = Scheduler(
            config,
            self.allocator,
            self.runner.cache.copy_blocks,
            self.slots,
            reservation,
            self.runner.host_swap,
            None if self.proposer is None else self.proposer.propose,
        )
        self.validator = RequestValidator(
            tokenizer,
            model.config.vocab_size,
            self.max_model_len,
            config,
            self.runner.num_blocks,
            self.scheduler.reservation,
        )
        self.ledger = Ledger(max_records=config.ledger_size)
        # stays empty when tracing is off
        self.trace: deque[StepRecord] = deque(maxlen=config.trace_steps)
        # the most recent scheduler tick, for inspection
        self.last_schedule: SchedulerOutput | None = None
        self.num_steps = 0  # steps in which something happened (the trace's step numbers)
        # live requests; each sequence points to its own
        self._requests: dict[str, EngineRequest] = {}
        self._pending: list[RequestOutput] = []  # final outputs of requests ended between steps
        self._arrivals = itertools.count()
        self._seed_rng = random.Random(config.seed)
        # every id in config.json / generation_config.json
        self._eos = frozenset(model.config.eos_token_ids)

    def step(self) -> StepOutputs:
        """One iteration: end expired deadlines, schedule, phases 2-5 (:meth:`_run`), a trace record
        if on. Returns its outputs (deltas, finished requests included), the requests admitted, the
        preemptions."""
        start = self.clock()
        self.last_accepted = {}
        outputs, self._pending = self._pending, []
        outputs += self._expire_deadlines(start)
        sched = self.last_schedule = self.scheduler.schedule()
        outputs += self._fail_unschedulable() if sched.is_empty else self._run(sched, start)
        # a draft model's KV goes with a sequence that ended or was preempted
        if self.proposer is not None:
            self.proposer.keep_only({s.seq_id for s in self.scheduler.running})
        if sched.is_empty and not (
            outputs or sched.preempted or sched.swapped_out or sched.swapped_in
        ):
            return StepOutputs(outputs)
        if self.config.trace_steps:  # tracing is off by default
            self.trace.append(
                StepRecord.of_step(
                    self.num_steps,
                    start,
                    self.clock(),
                    sched,
                    outputs,
                    self.allocator,
                    self.scheduler,
                    self.last_accepted,
                )
            )
        self.num_steps += 1
        admitted = set(sched.admitted)
        return StepOutputs(
            outputs,
            admitted=tuple(
                dict.fromkeys(
                    c.seq.request.request_id for c in sched.chunks if c.seq_id in admitted
                )
            ),
            num_preempted=len(sched.preempted) + len(sched.swapped_out),
            num_batched_tokens=sched.num_batched_tokens,
        )

    # ----------------------------------------------------------------------------------- the phases

    def _run(self, sched: SchedulerOutput, start: float) -> list[RequestOutput]:
        """Phases 2-5 of a non-empty tick. A failing forward pass fails every request in the batch,
        a failing sampler every sampled one; either way through the one terminal path, nothing
        leaks."""
        batch = self._prepare_inputs(sched, start)
        try:
            logits = self.runner.execute(batch)
        except Exception as exc:
            return self._fail([c.seq for c in sched.chunks], exc)
        # the KV of every chunk is now in the pool (verify rows: see _verify)
        for chunk in sched.chunks:
            if not chunk.draft_ids:
                self.scheduler.commit(chunk)
        logits, score_logits = (
            logits[: len(batch.sample_indices)],
            logits[len(batch.sample_indices) :],
        )
        logits, verify_rows = _split_verify_rows(sched.chunks, logits)
        sampled = [c.seq for c in sched.chunks if c.emits_token and not c.draft_ids]
        # n > 1: a prompt just computed forks into n samples
        if any(seq.samples_to_fork for seq in sampled):
            picks = fork_finished_prompts(self.scheduler, sampled)
        else:
            # (sample, its row of the logits)
            picks = [(seq, row) for row, seq in enumerate(sampled)]
        try:
            if batch.score_rows:
                logprobs.score_prompts(batch.score_rows, score_logits)
            tokens = [[token] for token in self._sample(logits, picks)]
            tokens += [self._verify(chunk, rows) for chunk, rows in verify_rows]
        except Exception as exc:
            return self._fail([seq for seq, _ in picks] + [c.seq for c, _ in verify_rows], exc)
        return self._process_outputs(
            [seq for seq, _ in picks] + [c.seq for c, _ in verify_rows], tokens
        )

    def _prepare_inputs(self, sched: SchedulerOutput, start: float) -> ForwardInput:
        """Phase 2: the tick's chunks as one flat batch."""
        rows = []
        for chunk in sched.chunks:
            seq = chunk.seq
            if seq.times.first_scheduled is None:
                seq.times.first_scheduled = start
            rows.append((chunk, seq, self.allocator.block_table(seq.seq_id)))
        return ForwardInput.from_chunks(rows)

    def _sample(
        self, logits: torch.Tensor, picks: list[tuple[EngineSequence, int]]
    ) -> list[int | None]:
        """Phase 4: one token per picked sample, drawn from its logits row (forked samples share
        one)."""
        if len(picks) != logits.shape[0]:
            logits = logits[torch.tensor([row for _, row in picks], device=logits.device)]
        seqs = [s for s, _ in picks]
        # {} unless a request has a grammar
        masks = structured.grammar_masks(seqs, logits.shape[-1])
        tokens = sample_tokens(
            logits,
            [
                SamplingRow(s.params, s.prompt_ids, s.output_ids, s.generator, masks.get(i))
                for i, s in enumerate(seqs)
            ],
        )
        if masks:
            structured.accept_tokens(seqs, masks, tokens)
        if any(s.params.logprobs is not None for s in seqs):
            logprobs.record_sampled(logits, seqs, tokens)
        return tokens

    def _verify(self, chunk: ScheduledChunk, logits: torch.Tensor) -> list[int | None]:
        """Phase 4 of a verify row: the accepted drafts plus one token (cut after an EOS), the
        rejected drafts' KV rolled back (``Scheduler.commit_verified``), a grammar's state moved by
        the emitted tokens (:mod:`~servelab.engine.structured`), the counters and logprobs
        updated."""
        seq, drafts = chunk.seq, chunk.draft_ids
        masks = (None if seq.params.grammar is None
                 else structured.verify_masks(seq, drafts, logits.shape[-1]))
        result = verify(logits, seq, drafts, self.proposer.draft_probs(seq, drafts), masks)
        self.scheduler.commit_verified(chunk, result.accepted)
        self.spec_stats.observe(len(drafts), result.accepted)
        self.last_accepted[seq.seq_id] = result.accepted
        tokens = result.tokens
        if not seq.params.ignore_eos:
            tokens = next((tokens[:i + 1] for i, t in enumerate(tokens) if t in self._eos), tokens)
        if masks is not None:  # the grammar moves by the emitted tokens: rejected drafts left none
            structured.advance(seq, tokens)
        if seq.params.logprobs is not None:
            logprobs.record_sampled(logits[:len(tokens)], [seq] * len(tokens), tokens)
        return tokens

    def _process_outputs(
        self, seqs: list[EngineSequence], tokens: list[list[int | None]]
    ) -> list[RequestOutput]:
        """Phase 5: each sampled token becomes text and maybe a stop; one output per sampled
        request. A verify row brings several tokens: they are taken in order up to the first stop
        (the rest dropped). A sample that fails (masked vocabulary, undecodable text) fails its
        whole request."""
        now = self.clock()
        # every sampled request, batch order
        stops: dict[EngineRequest, list[tuple[EngineSequence, str]]] = {}
        failures: dict[EngineRequest, str] = {}
        for seq, seq_tokens in zip(seqs, tokens):
            request = seq.request
            stops.setdefault(request, [])
            if request in failures:  # a sibling already failed it: the whole request ends
                continue
            for token in seq_tokens:
                reason, detail = accept_token(seq, token, now, self._eos, self.max_model_len)
                if reason is not None:
                    break
            del seq.logprobs.generated[len(seq.output_ids):]  # those of tokens dropped after a stop
            if reason == "failed":
                failures[request] = detail
            elif reason is not None:
                stops[request].append((seq, reason))
        return [self._finish_stopped(r, stops[r], failures.get(r)) for r in stops]

    def _finish_stopped(self, request: EngineRequest, stops: list[tuple[EngineSequence, str]],
                        failure: str | None) -> RequestOutput:
        """This step's output for a sampled request: finish the text of the samples that stopped,
        release them early when siblings go on, and end the request once no sample is left."""
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

    # -------------------------------------------------------------------------------------- the end

    def _expire_deadlines(self, now: float) -> list[RequestOutput]:
        expired = [
            r
            for r in self._requests.values()
            if r.seq.deadline is not None and now >= r.seq.deadline
        ]
        return [self._end(r, "timed_out") for r in expired]

    def _fail_unschedulable(self) -> list[RequestOutput]:
        """An idle engine that cannot admit its first waiting request never will: fail it, not
        hang."""
        ready = [seq for seq in self.scheduler.waiting if not seq.paused]
        if not ready or self.scheduler.running or self.scheduler.swapped:
            return []
        stuck = min(ready, key=self.scheduler.key).request
        return [self._end(stuck, "failed", detail="cannot be scheduled even on an idle engine")]

    def _fail(self, seqs: list[EngineSequence], exc: Exception) -> list[RequestOutput]:
        """End every request that ``seqs`` sample for as failed, with the exception as the
        detail."""
        requests = dict.fromkeys(s.request for s in seqs)
        return [self._end(r, "failed", detail=repr(exc)) for r in requests]

    def _end(
        self, request: EngineRequest, reason: str, detail: str = "", at: float | None = None
    ) -> RequestOutput:
        """The one terminal path: finish every unfinished sample's text with ``reason``, then §0's
        :func:`~servelab.lifecycle.state_machine.reclaim` releases every sequence's reservation,
        blocks, batch slots and host swap copy and writes the one terminal record; the sequences
        leave their queues and are let go so refcounting frees them. ``at``: the end time, when the
        caller already read the clock."""
        now = self.clock() if at is None else at
        lifecycle = RequestLifecycle(request.request_id, now, state=lifecycle_state(request))
        for seq in request.seqs:
            if seq.finish_reason is None:
                finish_text(seq, reason, now)
        request.finish_reason = reason
        reclaim(lifecycle, TERMINAL_STATE[reason], ledger=self.ledger, at=now,
                reason=f"{reason}: {detail}" if detail else reason, allocator=self.allocator,
                seq_ids=[seq.seq_id for seq in request.seqs], slots=self.slots,
                host_swap=self.scheduler.swap_space, usage=usage(request.seqs))
        for seq in request.seqs:
            self.scheduler.retire(seq)
        del self._requests[request.request_id]
        output = request_output(request.request_id, request.seqs, reason)
        # break the request <-> sequence cycle: refcounting, not the cyclic GC, frees both
        request.seqs = []
        return output


def _split_verify_rows(chunks: list[ScheduledChunk], logits: torch.Tensor
                       ) -> tuple[torch.Tensor, list[tuple[ScheduledChunk, torch.Tensor]]]:
    """The sampled logits (one row per emitting chunk, ``1 + len(draft_ids)`` per verify row, chunk
    order) split into the one-token rows and each verify row's block."""
    if not any(c.draft_ids for c in chunks):
        return logits, []
    plain, verify_rows, row = [], [], 0
    for chunk in (c for c in chunks if c.emits_token):
        width = 1 + len(chunk.draft_ids)
        if chunk.draft_ids:
            verify_rows.append((chunk, logits[row:row + width]))
        else:
            plain.append(row)
        row += width
    return logits[torch.tensor(plain, dtype=torch.long, device=logits.device)], verify_rows
