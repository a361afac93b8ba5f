"""The scheduler: one :meth:`Scheduler.schedule` call is one scheduler tick.

A tick decides what the next forward pass computes, under three limits at once:

* ``max_num_seqs`` batch slots (sequences holding KV blocks and running; a request with ``n`` samples
  takes ``n`` from admission, since its prompt forks into ``n`` sequences: :meth:`Scheduler.fork`);
* ``max_num_batched_tokens``, the per-iteration token budget shared by decode tokens (1 per running
  sequence) and prefill chunks (chunked prefill cuts a long prompt into budget-sized pieces);
* the KV block pool (``servelab.kv.BlockAllocator``): admission reserves what the configured
  ``ReservationPolicy`` promises (``servelab.engine.reservation``: the uncached prompt blocks on demand,
  plus ``max_tokens`` of output up front) and allocates the prompt; a decode step that needs a new block
  and finds none preempts the lowest-ranked running sequence (recompute: drop its KV; swap: copy it to
  host memory), which under the up-front promise never happens.

Order of a tick: swap-ins (in policy order) -> running sequences in policy order (each gets its decode
token or next prefill chunk; those the token budget cannot reach are *descheduled* for the tick: they
keep their KV, so this frees compute, not memory) -> admissions from the waiting queue in policy order.
Admission stops for the tick once anything was preempted or is still swapped out (and not paused), so
freed memory goes back to the victims first.

A *paused* sequence (``Sequence.paused``, set by ``LLMEngine.pause``) is descheduled until resumed:
every tick skips it in all three queues. A running one keeps its KV blocks and batch slot, a waiting
one is not admitted, a swapped one is not swapped in. Pausing frees compute, not memory; a paused
running sequence can still be picked as a preemption victim like any other.

System boundary: the scheduler moves block ids and sequences. Bytes move through the :class:`KVMover`
it is given (copy-on-write, swap out/in), always before the blocks involved can be reused. It never runs
the model or samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from servelab.engine.config import EngineConfig
from servelab.engine.reservation import ReservationPolicy
from servelab.engine.sequence import Sequence, SeqStatus
from servelab.kv.allocator import BlockAllocator, BlockCopy, OutOfBlocks
from servelab.lifecycle import SlotPool
from servelab.queue_policy import POLICIES


class KVMover(Protocol):
    """Moves KV bytes between physical blocks and host memory (implemented by the model runner)."""

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy physical block ``src`` into ``dst`` for each pair, now."""

    def swap_out(self, seq_id: str, blocks: list[int]) -> bool:
        """Copy ``blocks`` to host memory under ``seq_id``; False (nothing copied) when host space is full."""

    def swap_in(self, seq_id: str, blocks: list[int]) -> None:
        """Write ``seq_id``'s host copy into ``blocks`` and release its host space."""

    def drop_swapped(self, seq_id: str) -> int:
        """Release ``seq_id``'s host copy, if any; returns the blocks' worth of host memory freed."""


@dataclass(frozen=True)
class ScheduledChunk:
    """Compute ``num_tokens`` tokens of sequence ``seq`` from position ``start``.

    ``emits_token`` is True when the chunk reaches the sequence's last known token, so its logits give
    the next token (the last prefill chunk, or a decode step).
    """

    seq: Sequence
    start: int
    num_tokens: int
    emits_token: bool

    @property
    def seq_id(self) -> str:
        """The scheduled sequence's id."""
        return self.seq.seq_id


@dataclass(frozen=True)
class Released:
    """What :meth:`Scheduler.release` gave back for one sequence (blocks, batch slots, host blocks)."""

    blocks: int
    reservation: int
    slots: int
    swap: int


@dataclass
class SchedulerOutput:
    """What one tick decided. Lists hold sequence ids; counts are tokens or blocks as named."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)  # by recompute: KV dropped
    swapped_out: list[str] = field(default_factory=list)
    swapped_in: list[str] = field(default_factory=list)
    descheduled: list[str] = field(default_factory=list)  # running, KV kept, token budget did not reach it
    paused: list[str] = field(default_factory=list)  # paused by the caller, skipped in whichever queue it is
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst) done this tick

    @property
    def num_batched_tokens(self) -> int:
        """Tokens in the forward pass this tick decided."""
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        """Nothing to compute this tick."""
        return not self.chunks


class Scheduler:
    """Continuous batching over the waiting, running and swapped queues."""

    def __init__(self, config: EngineConfig, allocator: BlockAllocator, mover: KVMover, slots: SlotPool,
                 max_model_len: int | None = None) -> None:
        self.config = config
        self.reservation = ReservationPolicy(config.reservation_policy, config.block_size, max_model_len)
        self.allocator = allocator
        self.mover = mover
        self.slots = slots  # batch slots: one per sequence holding device KV (max_num_seqs)
        self.key = POLICIES[config.policy]  # sort key: smaller runs first, is preempted last
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []

    # ------------------------------------------------------------------------------- queue membership

    def add(self, seq: Sequence) -> None:
        """Queue a new request for admission."""
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def release(self, seq: Sequence) -> Released:
        """The one release path of a sequence that ends (finished, cancelled, timed out, failed, or one
        sample of several finished early): out of its queue, then its KV reservation, device blocks
        (decref: a block shared with a sibling or a prefix stays with its other holders), batch slots and
        host swap copy go back. Releasing a released sequence gives back nothing."""
        if seq.status is SeqStatus.FINISHED:
            return Released(0, 0, 0, 0)
        queue = {SeqStatus.WAITING: self.waiting, SeqStatus.RUNNING: self.running,
                 SeqStatus.SWAPPED: self.swapped}[seq.status]
        if seq in queue:  # a sibling that never forked was in no queue
            queue.remove(seq)
        seq.status = SeqStatus.FINISHED
        reservation = self.allocator.release_reservation(seq.seq_id)
        return Released(self.allocator.free(seq.seq_id), reservation, self.slots.release(seq.seq_id),
                        self.mover.drop_swapped(seq.seq_id))

    # ------------------------------------------------------------------------------- the tick

    def schedule(self) -> SchedulerOutput:
        """Decide the next forward pass; see the module docstring for the order of decisions."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        self._swap_in(out)
        self.running.sort(key=self.key)
        budget = self._schedule_running(out, budget)
        scheduled = {c.seq_id for c in out.chunks}
        out.descheduled = [s.seq_id for s in self.running if s.seq_id not in scheduled and not s.paused]
        out.paused = [s.seq_id for queue in (self.running, self.swapped, self.waiting) for s in queue if s.paused]
        if not out.preempted and not out.swapped_out and not any(not s.paused for s in self.swapped):
            self._admit_waiting(out, budget)
        return out

    def fork(self, parent: Sequence, children: list[Sequence]) -> None:
        """Split ``parent``, whose prompt is computed, into itself plus ``children`` (parallel sampling).

        Each child gets a block table sharing every block of the parent (``BlockAllocator.fork``: refcount
        + 1, no bytes move; a later write into the shared partially filled tail is copied on write by
        :meth:`_grow_kv`), the parent's progress, one of the batch slots the parent held for it, and
        a place in the running queue. Called by the engine right after the parent's last prompt chunk.
        """
        self.slots.release(parent.seq_id)  # the parent held 1 + len(children) slots since admission
        for seq in (parent, *children):
            self.slots.acquire(seq.seq_id)
        for child in children:
            self.allocator.fork(parent.seq_id, child.seq_id)
            child.num_computed = parent.num_computed
            child.cached_prompt_tokens = parent.cached_prompt_tokens
            child.paused = parent.paused
            child.status = SeqStatus.RUNNING
            self.running.append(child)
        self.reservation.split_at_fork(self.allocator, parent, children)
        parent.samples_to_fork = 0

    def commit(self, chunk: ScheduledChunk) -> None:
        """Record that the forward pass computed ``chunk``: advance ``num_computed`` and tell the allocator,
        which only now offers the blocks it filled to the prefix cache (``cache_on_compute``)."""
        seq = chunk.seq
        seq.num_computed = chunk.start + chunk.num_tokens
        self.allocator.mark_computed(seq.seq_id, seq.num_computed)

    # ------------------------------------------------------------------------------- running sequences

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            count = 0 if seq.paused else self._chunk_size(seq, budget)
            if count == 0:
                i += 1
                continue
            if not self._grow_kv(seq, seq.num_computed + count, out):
                continue  # seq itself was preempted; the list shifted
            self._add_chunk(out, seq, count)
            budget -= count
            i += 1
        return budget

    def _chunk_size(self, seq: Sequence, budget: int) -> int:
        """Tokens of ``seq`` to compute this tick: all that remain, or a budget-sized chunk (0 = wait)."""
        remaining = seq.num_uncomputed
        if remaining <= budget:
            return remaining
        return budget if self.config.enable_chunked_prefill else 0

    def _grow_kv(self, seq: Sequence, upto: int, out: SchedulerOutput) -> bool:
        """Grow ``seq``'s KV allocation to hold positions up to ``upto`` (token slots in its blocks),
        preempting others (or seq) when the pool is short.

        Returns False when ``seq`` itself had to be preempted.
        """
        have = self.allocator.num_tokens(seq.seq_id)
        if have >= upto:
            return True
        new_ids = seq.tokens_between(have, upto)
        while True:
            try:
                copies = self.allocator.append_tokens(seq.seq_id, new_ids)
            except OutOfBlocks:
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    return False
                continue
            self._execute_copies(copies, out)
            return True

    def _add_chunk(self, out: SchedulerOutput, seq: Sequence, count: int) -> None:
        out.chunks.append(ScheduledChunk(seq, seq.num_computed, count,
                                         emits_token=seq.num_computed + count == seq.num_tokens))

    # ------------------------------------------------------------------------------- preemption

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Free ``seq``'s device blocks: swap its computed KV to host memory if configured and possible,
        otherwise drop it (recompute later)."""
        self.running.remove(seq)
        self.slots.release(seq.seq_id)
        computed_blocks = self.allocator.block_table(seq.seq_id)[:self._blocks_for(seq.num_computed)]
        swapped = (self.config.preemption_mode == "swap" and seq.num_computed > 0
                   and self.mover.swap_out(seq.seq_id, computed_blocks))
        self.allocator.free(seq.seq_id)
        if swapped:
            seq.status = SeqStatus.SWAPPED
            self.swapped.append(seq)
            out.swapped_out.append(seq.seq_id)
        else:
            seq.num_computed = 0
            seq.status = SeqStatus.WAITING
            self.waiting.append(seq)
            out.preempted.append(seq.seq_id)

    def _swap_in(self, out: SchedulerOutput) -> None:
        """Bring swapped sequences (not paused ones) back while slots and blocks allow, best-ranked first."""
        self.swapped.sort(key=self.key)
        for seq in [s for s in self.swapped if not s.paused]:
            if self.slots.available < seq.batch_slots:
                return
            need = self._blocks_for(seq.num_tokens)  # its KV plus the slots of its next chunk
            if not self.allocator.reserve(seq.seq_id, need):
                return
            self.slots.acquire(seq.seq_id, seq.batch_slots)
            blocks = self.allocator.restore(seq.seq_id, seq.num_computed, seq.token_ids[:seq.num_computed],
                                            namespace=seq.namespace)
            self.allocator.release_reservation(seq.seq_id)
            self.mover.swap_in(seq.seq_id, blocks)
            self.allocator.mark_computed(seq.seq_id, seq.num_computed)  # the KV is back: offer it to the cache
            self.swapped.remove(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            out.swapped_in.append(seq.seq_id)

    # ------------------------------------------------------------------------------- admission

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        self.waiting.sort(key=self.key)
        for seq in [s for s in self.waiting if not s.paused]:
            if budget == 0 or not self.slots.available:
                return
            if not self._try_admit(seq, budget, out):
                return  # no room: later requests must not overtake this one
            budget -= out.chunks[-1].num_tokens

    def _try_admit(self, seq: Sequence, budget: int, out: SchedulerOutput) -> bool:
        """Admit ``seq`` and schedule its first chunk. True: admitted; False: no room (blocks or token budget).

        Skipping the cached prefix is safe: the allocator (``cache_on_compute``) offers a block to the
        prefix cache only once :meth:`commit` reports it computed, so blocks another request is still
        prefilling, or abandoned half-way, are simply a miss and get computed here.
        """
        tokens = seq.token_ids
        if self.slots.available < seq.batch_slots:
            return False
        if (not self.config.enable_chunked_prefill
                and len(tokens) - self.allocator.lookup_prefix(tokens, seq.namespace) > budget):
            return False
        if not self.reservation.admit(self.allocator, seq):  # phase 1: the blocks it is promised
            return False
        allocation = self.allocator.allocate_prompt(seq.seq_id, tokens, seq.namespace)  # fits the reservation
        self._execute_copies(allocation.copies, out)
        self.reservation.keep_output_promise(self.allocator, seq)  # phase 2: only the output's promise stays
        cached = allocation.cached_prompt_tokens
        count = min(len(tokens) - cached, budget)
        self.waiting.remove(seq)
        self.slots.acquire(seq.seq_id, seq.batch_slots)
        seq.num_computed = cached
        if seq.cached_prompt_tokens is None:
            seq.cached_prompt_tokens = min(cached, len(seq.prompt_ids))
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        out.admitted.append(seq.seq_id)
        self._add_chunk(out, seq, count)
        return True

    # ------------------------------------------------------------------------------- helpers

    def _execute_copies(self, copies: tuple[BlockCopy, ...], out: SchedulerOutput) -> None:
        """Copy-on-write now: the source may be a free cached block that the next allocation reuses."""
        pairs = [(c.src, c.dst) for c in copies]
        self.mover.copy_blocks(pairs)
        out.copies.extend(pairs)

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.config.block_size)
