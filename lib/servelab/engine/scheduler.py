"""The scheduler: one :meth:`Scheduler.schedule` call is one scheduler tick.

A tick decides what the next forward pass computes under three limits: ``max_num_seqs`` batch slots
(a request with ``n`` samples takes ``n`` from admission), the ``max_num_batched_tokens`` budget
shared by decode tokens and prefill chunks, and the KV block pool, whose admission rule is a
:class:`~servelab.engine.admission.ReservationPolicy`. A decode that finds no free block preempts
the lowest-ranked running sequence. A *paused* sequence (``LLMEngine.pause``) is skipped in every
queue and keeps what it holds. Off the default step: swapping (:meth:`Scheduler.swap_out`,
:meth:`Scheduler.swap_in`, the host copies in :mod:`~servelab.engine.swap`), the up-front rule of
:mod:`~servelab.engine.admission` and the fork of ``n > 1`` samples (:meth:`Scheduler.fork`, when:
:mod:`~servelab.engine.parallel_sampling`).

System boundary: the scheduler moves block ids and sequences; KV bytes are copied by the
``copy_blocks`` function it is given (copy-on-write) and swapped through the host swap space, always
before the blocks involved can be reused. Time is counted in ticks (one per
:meth:`Scheduler.schedule`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from servelab.engine.admission import ReservationPolicy
from servelab.engine.config import EngineConfig
from servelab.engine.sequence import EngineSequence, SeqStatus
from servelab.engine.swap import HostSwapSpace
from servelab.kv.allocator import BlockAllocator, BlockCopy, OutOfBlocks
from servelab.kv.arithmetic import blocks_for
from servelab.lifecycle.state_machine import SlotPool
from servelab.scheduling.queue_policy import rank_waiting, running_key


CopyBlocks = Callable[[list[tuple[int, int]]], None]
"""Copies the KV of physical block ``src`` into ``dst`` for each ``(src, dst)``, now
(``KVCache.copy_blocks``)."""

Propose = Callable[[EngineSequence, int], list[int]]
"""Speculative decoding: at most ``limit`` draft token ids to verify after the decoding sequence's
last token (:mod:`~servelab.engine.spec_propose`)."""


@dataclass(frozen=True)
class ScheduledChunk:
    """Compute ``num_tokens`` tokens of ``seq`` from position ``start``; ``emits_token``: the chunk
    reaches the sequence's last known token, so its logits give the next one. ``draft_ids``: a
    verify
    row (speculative decoding): the last token then these proposals, ``num_tokens = 1 +
    len(draft_ids)``, every position's logits kept."""

    seq: EngineSequence
    start: int
    num_tokens: int
    emits_token: bool
    draft_ids: tuple[int, ...] = ()

    @property
    def seq_id(self) -> str:
        return self.seq.seq_id


@dataclass
class PreemptionStats:
    """What preemption by recompute cost so far, and what the prefix cache saved of it. Counts are
    tokens, except ``num_preemptions`` and ``preempted_requests``. The last three are vLLM V1's
    ``PrefixCacheStats`` fields of the same names (``vllm/v1/metrics/stats.py``): the prefix-cache
    lookups of requests admitted again after a preemption, kept apart from those of new requests.

    Attributes:
        num_preemptions: sequences preempted by recompute (a failed swap-out counts here).
        dropped_tokens: computed tokens whose KV those preemptions gave up.
        recomputed_tokens: tokens whose KV a sequence had computed before a preemption and computed
            again after it (the prefix-cache hits at readmission are not among them).
        preempted_requests: readmissions of preempted sequences.
        preempted_queries: tokens those readmissions looked up in the prefix cache (all of theirs).
        preempted_hits: of those, tokens found there (full blocks), not computed again.
    """

    num_preemptions: int = 0
    dropped_tokens: int = 0
    recomputed_tokens: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    @property
    def hit_rate(self) -> float:
        """``preempted_hits / preempted_queries`` (0.0 before any readmission)."""
        return self.preempted_hits / self.preempted_queries if self.preempted_queries else 0.0


@dataclass
class SchedulerOutput:
    """What one tick decided. Lists hold sequence ids."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)  # by recompute: KV dropped
    swapped_out: list[str] = field(default_factory=list)
    swapped_in: list[str] = field(default_factory=list)
    # running, KV kept, token budget did not reach it
    descheduled: list[str] = field(default_factory=list)
    # paused by the caller, skipped in whichever queue it is
    paused: list[str] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


class Scheduler:
    """Continuous batching over the waiting, running and swapped queues. For the queue policies it
    keeps ``ticks`` (run so far; a sequence's ``waited`` counts the ticks since it was queued,
    preemption not resetting it) and ``served`` (tenant -> tokens sampled for its sequences so
    far)."""

    def __init__(
        self,
        config: EngineConfig,
        allocator: BlockAllocator,
        copy_blocks: CopyBlocks,
        slots: SlotPool,
        reservation: ReservationPolicy,
        swap_space: HostSwapSpace | None = None,
        propose: Propose | None = None,
    ) -> None:
        self.config = config
        self.propose = propose  # speculative decoding's proposer (None: one token per decode)
        self.reservation = reservation
        self.allocator = allocator
        self.copy_blocks = copy_blocks
        self.swap_space = swap_space  # where preemption by swap puts KV (None: no host swap space)
        self.slots = slots  # batch slots: one per sequence holding device KV (max_num_seqs)
        self.key = running_key(config.policy)  # smaller runs first, is preempted last
        self.waiting: list[EngineSequence] = []
        self.running: list[EngineSequence] = []
        self.swapped: list[EngineSequence] = []
        self.ticks = 0
        self.served: dict[str, int] = {}
        self.preemption = PreemptionStats()
        # seq id -> tokens it had computed when last preempted by recompute, until it is past them
        self._dropped_at: dict[str, int] = {}

    def add(self, seq: EngineSequence) -> None:
        """Queue a new request for admission."""
        seq.status = SeqStatus.WAITING
        seq.queued_tick = self.ticks
        self.waiting.append(seq)

    def release(self, seq: EngineSequence) -> None:
        """A sample that stopped while its siblings go on: its reservation, device blocks (decref:
        blocks shared with the others stay), batch slots and host swap copy go back now, and it
        leaves its queue. A request that ends is released by §0's ``reclaim`` instead
        (``EngineCore._end``)."""
        self.allocator.free(seq.seq_id)
        self.slots.release(seq.seq_id)
        if self.swap_space is not None:
            self.swap_space.release(seq.seq_id)
        self.retire(seq)

    def retire(self, seq: EngineSequence) -> None:
        """Take an ending sequence out of its queue and mark it FINISHED; what it held was released
        already. Retiring a retired sequence changes nothing."""
        if seq.status is SeqStatus.FINISHED:
            return
        queue = {SeqStatus.WAITING: self.waiting, SeqStatus.RUNNING: self.running,
                 SeqStatus.SWAPPED: self.swapped}[seq.status]
        if seq in queue:  # a sibling that never forked was in no queue
            queue.remove(seq)
        self._dropped_at.pop(seq.seq_id, None)  # its preemption bookkeeping ends with it
        seq.status = SeqStatus.FINISHED

    def schedule(self) -> SchedulerOutput:
        """Decide the next forward pass: swap-ins -> running sequences in policy order (a decode
        token or the next prefill chunk each; those the budget cannot reach are *descheduled*: KV
        kept) -> admissions in policy order, skipped once anything was preempted or is still swapped
        out."""
        self.ticks += 1
        out = SchedulerOutput()
        if self.swapped:
            self.swap_in(out)
        self.running.sort(key=self.key)
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        scheduled = {c.seq_id for c in out.chunks}
        out.descheduled = [
            s.seq_id for s in self.running if s.seq_id not in scheduled and not s.paused
        ]
        out.paused = [
            s.seq_id
            for queue in (self.running, self.swapped, self.waiting)
            for s in queue
            if s.paused
        ]
        if (
            not out.preempted
            and not out.swapped_out
            and not any(not s.paused for s in self.swapped)
        ):
            self._admit_waiting(out, budget)
        return out

    def rank_waiting(self) -> list[EngineSequence]:
        """The waiting queue best first under the policy (it is kept in that order)."""
        for seq in self.waiting:
            seq.waited = self.ticks - seq.queued_tick
        self.waiting = rank_waiting(
            self.config.policy, self.waiting, self.served, self.config.aging_rate
        )
        return self.waiting

    def commit(self, chunk: ScheduledChunk) -> None:
        """The forward pass computed ``chunk``: advance ``num_computed``, let the allocator offer
        the blocks it filled to the prefix cache, and count a sampled token for the tenant."""
        seq = chunk.seq
        seq.num_computed = chunk.start + chunk.num_tokens
        self._count_recompute(seq.seq_id, chunk.start, seq.num_computed)
        self.allocator.mark_computed(seq.seq_id, seq.num_computed)
        if chunk.emits_token:
            self.served[seq.tenant] = self.served.get(seq.tenant, 0) + 1

    def commit_verified(self, chunk: ScheduledChunk, accepted: int) -> int:
        """The forward pass verified ``chunk``'s drafts and ``accepted`` of them stay: the last
        token and those drafts have committed KV, the slots of the rejected ones are rolled back
        (``num_computed`` and the allocation move back, blocks holding only rejected slots are
        freed; under a rule that never preempts they return to the sequence's reservation). Call
        before the accepted tokens are appended to the sequence. Returns the blocks freed."""
        seq = chunk.seq
        kept = chunk.start + 1 + accepted
        seq.num_computed = kept
        block_size = self.allocator.block_size
        known = seq.tokens_between(kept // block_size * block_size, chunk.start + 1)
        tail = (
            (known + list(chunk.draft_ids[:accepted]))[-(kept % block_size) :]
            if kept % block_size
            else []
        )
        freed = self.allocator.truncate(seq.seq_id, kept, tail)
        if freed and not self.reservation.preempts:
            self.allocator.reserve(seq.seq_id, freed)
        self.allocator.mark_computed(seq.seq_id, kept)
        self.served[seq.tenant] = self.served.get(seq.tenant, 0) + 1 + accepted
        return freed

    def _count_recompute(self, seq_id: str, start: int, end: int) -> None:
        """Count the tokens of ``[start, end)`` that ``seq_id`` had computed before its last
        preemption."""
        dropped = self._dropped_at.get(seq_id)
        if dropped is None:
            return
        self.preemption.recomputed_tokens += max(0, min(end, dropped) - start)
        if end >= dropped:
            del self._dropped_at[seq_id]

    # ---------------------------------------------------------------------------- running sequences

    def swap_out(self, seq: EngineSequence, out: SchedulerOutput) -> bool:
        """Preempt ``seq`` (already out of the running queue and its batch slots) by swap: copy its
        computed KV to host memory, free its device blocks and queue it as swapped. False, nothing
        done, when it has no computed KV, or there is no host swap space or not enough of it
        left."""
        space, computed = self.swap_space, blocks_for(seq.num_computed, self.config.block_size)
        if space is None or not computed:
            return False
        if not space.store(seq.seq_id, self.allocator.block_table(seq.seq_id)[:computed]):
            return False
        self.allocator.free(seq.seq_id)
        seq.status = SeqStatus.SWAPPED
        self.swapped.append(seq)
        out.swapped_out.append(seq.seq_id)
        return True


    def swap_in(self, out: SchedulerOutput) -> None:
        """One tick's swap-ins: bring swapped sequences (not paused ones) back while batch slots and
        blocks allow, best-ranked first; each gets fresh blocks (``BlockAllocator.restore``) its
        host copy is written into, and rejoins the running queue."""
        self.swapped.sort(key=self.key)
        for seq in [s for s in self.swapped if not s.paused]:
            if self.slots.available < seq.batch_slots:
                return
            if not self.allocator.reserve(
                seq.seq_id, blocks_for(seq.num_tokens, self.config.block_size)
            ):
                return  # its KV plus the slots of its next chunk
            self.slots.acquire(seq.seq_id, seq.batch_slots)
            blocks = self.allocator.restore(
                seq.seq_id,
                seq.num_computed,
                seq.token_ids[: seq.num_computed],
                namespace=seq.namespace,
            )
            self.allocator.release_reservation(seq.seq_id)
            self.swap_space.restore(seq.seq_id, blocks)
            # the KV is back: offer it to the cache
            self.allocator.mark_computed(seq.seq_id, seq.num_computed)
            self.swapped.remove(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            out.swapped_in.append(seq.seq_id)

    def fork(self, parent: EngineSequence, children: list[EngineSequence]) -> None:
        """``n > 1``: split ``parent``, whose prompt is computed, into itself plus ``children``
        (they join the running queue sharing its blocks; :mod:`servelab.engine.parallel_sampling`
        says when)."""
        self.slots.release(parent.seq_id)  # the parent held 1 + len(children) slots since admission
        for seq in (parent, *children):
            self.slots.acquire(seq.seq_id)
        for child in children:
            self.allocator.fork(parent.seq_id, child.seq_id)
            child.num_computed = parent.num_computed
            child.cached_prompt_tokens = parent.cached_prompt_tokens
            child.paused = parent.paused
            child.times.first_scheduled = parent.times.first_scheduled
            child.status = SeqStatus.RUNNING
            self.running.append(child)
        self._split_reservation(parent, children)
        parent.samples_to_fork = 0


    def _split_reservation(self, parent: EngineSequence, children: list[EngineSequence]) -> None:
        """The parent's promise (made for all ``n`` samples) is shared out evenly."""
        allocator = self.allocator
        total = allocator.release_reservation(parent.seq_id)
        share = total // (1 + len(children))
        for child in children:
            allocator.reserve(child.seq_id, share)
        allocator.reserve(parent.seq_id, total - share * len(children))

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            count = 0 if seq.paused else self._chunk_size(seq, budget)
            if count == 0:
                i += 1
                continue
            drafts = self._drafts(seq, budget)
            if not self._grow_kv(seq, seq.num_computed + count + len(drafts), out, drafts):
                continue  # seq itself was preempted; the list shifted
            self._add_chunk(out, seq, count, drafts)
            budget -= count + len(drafts)
            i += 1
        return budget

    def _chunk_size(self, seq: EngineSequence, budget: int) -> int:
        """Tokens of ``seq`` to compute this tick: all that remain, or a budget-sized chunk (0 =
        wait)."""
        remaining = seq.num_uncomputed
        if remaining <= budget:
            return remaining
        return budget if self.config.enable_chunked_prefill else 0

    def _drafts(self, seq: EngineSequence, budget: int) -> tuple[int, ...]:
        """Proposals to verify after ``seq``'s last token, within the token budget left: only when
        that token is all it has to compute, and not before a ``n > 1`` prompt has forked its
        samples."""
        if self.propose is None or seq.num_uncomputed != 1 or seq.samples_to_fork or budget < 2:
            return ()
        return tuple(self.propose(seq, budget - 1))

    def _grow_kv(
        self, seq: EngineSequence, upto: int, out: SchedulerOutput, drafts: tuple[int, ...] = ()
    ) -> bool:
        """Slots for positions up to ``upto`` (the sequence's tokens, then ``drafts``), preempting
        from the back of the running queue when the pool is short. False when ``seq`` itself was
        preempted."""
        have = self.allocator.num_tokens(seq.seq_id)
        if have >= upto:
            return True
        new_ids = (seq.tokens_between(have, upto) + list(drafts))[:upto - have]
        while True:
            try:
                copies = self.allocator.append_tokens(seq.seq_id, new_ids)
            except OutOfBlocks:
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    return False
                continue
            self._execute_copies(copies)
            return True

    def _add_chunk(
        self, out: SchedulerOutput, seq: EngineSequence, count: int, drafts: tuple[int, ...] = ()
    ) -> None:
        out.chunks.append(
            ScheduledChunk(
                seq,
                seq.num_computed,
                count + len(drafts),
                emits_token=seq.num_computed + count == seq.num_tokens,
                draft_ids=drafts,
            )
        )

    # ------------------------------------------------------------------------------- preemption

    def _preempt(self, seq: EngineSequence, out: SchedulerOutput) -> None:
        """Free ``seq``'s device blocks: swap its computed KV to host memory if configured and
        possible, otherwise drop it (recompute later). Dropped, its full computed blocks stay in the
        prefix cache as free, evictable blocks (``BlockPool.free``: tail first, so the prompt's head
        is evicted last), and readmission hits those still there (vLLM V1 frees a preempted
        request's blocks the same way, ``KVCacheManager.free``, keeping their hashes)."""
        self.running.remove(seq)
        self.slots.release(seq.seq_id)
        if self.config.preemption_mode == "swap" and self.swap_out(seq, out):
            return
        self.allocator.free(seq.seq_id)
        stats = self.preemption
        stats.num_preemptions += 1
        stats.dropped_tokens += seq.num_computed
        self._dropped_at[seq.seq_id] = max(seq.num_computed, self._dropped_at.get(seq.seq_id, 0))
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)
        out.preempted.append(seq.seq_id)

    # ------------------------------------------------------------------------------- admission

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        for seq in [s for s in self.rank_waiting() if not s.paused]:
            if budget == 0 or not self.slots.available:
                return
            if not self._try_admit(seq, budget, out):
                return  # no room: later requests must not overtake this one
            budget -= out.chunks[-1].num_tokens

    def _try_admit(self, seq: EngineSequence, budget: int, out: SchedulerOutput) -> bool:
        """Admit ``seq`` and schedule its first chunk; False: no room (slots, blocks or token
        budget). The rule decides how many of its tokens get slots now (the whole prompt, or under
        ``"per-step"`` only the first chunk). Skipping the cached prefix is safe: a block enters the
        prefix cache only once :meth:`commit` reports it computed, so a block another request is
        still prefilling is a miss here."""
        tokens = seq.token_ids
        if self.slots.available < seq.batch_slots:
            return False
        uncached = len(tokens) - self.allocator.lookup_prefix(tokens, seq.namespace)
        if not self.config.enable_chunked_prefill and uncached > budget:
            return False
        first_chunk_end = len(tokens) - uncached + min(uncached, budget)
        upto = self.reservation.slots_at_admission(len(tokens), first_chunk_end)
        if not self.reservation.admit(self.allocator, seq, upto):
            return False
        # fits the reservation just made
        allocation = self.allocator.allocate_prompt(seq.seq_id, tokens[:upto], seq.namespace)
        self._execute_copies(allocation.copies)
        self.reservation.keep_output_promise(self.allocator, seq)
        cached = allocation.cached_prompt_tokens
        if seq.seq_id in self._dropped_at:  # readmitted after a preemption by recompute
            self.preemption.preempted_requests += 1
            self.preemption.preempted_queries += len(tokens)
            self.preemption.preempted_hits += cached
        self.waiting.remove(seq)
        self.slots.acquire(seq.seq_id, seq.batch_slots)
        seq.num_computed = cached
        if seq.cached_prompt_tokens is None:
            seq.cached_prompt_tokens = min(cached, len(seq.prompt_ids))
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        out.admitted.append(seq.seq_id)
        self._add_chunk(out, seq, min(len(tokens) - cached, budget))
        return True

    def _execute_copies(self, copies: tuple[BlockCopy, ...]) -> None:
        """Copy-on-write now: the source may be a free cached block that the next allocation
        reuses."""
        if copies:
            self.copy_blocks([(c.src, c.dst) for c in copies])
