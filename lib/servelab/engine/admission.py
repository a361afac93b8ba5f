"""Admission: the KV blocks a request is promised when the scheduler admits it, under each rule.

The scheduler holds one :class:`ReservationPolicy`; the default, ``"on-demand"`` (as vLLM's first
engine), is that class itself. :class:`UpFrontReservation` is the course's other rule (as TGI): a
running request is never preempted, at the price of blocks promised (and idle) from admission to the
end. :class:`PerStepAllocation` is vLLM V1's rule: no reservation, blocks for the tokens each step
schedules. :func:`reservation_policy` builds the rule ``EngineConfig.reservation_policy`` names;
the rules in words, for the book, are :mod:`servelab.lifecycle.reservation_rules`. Units: blocks of
``block_size`` token slots; tokens for lengths.
"""

from __future__ import annotations

from servelab.engine.config import RESERVATION_POLICIES
from dataclasses import dataclass
from typing import ClassVar

from servelab.engine.sequence import EngineSequence
from servelab.kv.allocator import BlockAllocator
from servelab.kv.arithmetic import blocks_for

__all__ = ["ReservationPolicy", "UpFrontReservation", "PerStepAllocation", "RESERVATIONS",
           "reservation_policy"]


@dataclass(frozen=True)
class ReservationPolicy:
    """The admission rule (``EngineConfig.reservation_policy``): the KV blocks a request is
    promised. This class is the default, ``"on-demand"`` (as vLLM): the uncached prompt blocks only;
    the output grows block by block and a decode that finds the pool empty preempts (``"up-front"``:
    :class:`UpFrontReservation`). Two phases: :meth:`admit` reserves the whole promise,
    ``allocate_prompt`` takes the prompt blocks out of it, :meth:`keep_output_promise` leaves the
    output's promise reserved. Units: blocks of ``block_size`` token slots; ``max_model_len`` in
    tokens (None: no cap)."""

    block_size: int
    max_model_len: int | None = None
    name: ClassVar[str] = "on-demand"
    preempts: ClassVar[bool] = True  # running requests may be preempted for KV

    def output_blocks(self, num_tokens: int, remaining_tokens: int, samples: int) -> int:
        """Blocks promised for the output beyond those of the ``num_tokens`` already there: none."""
        return 0

    def worst_case_blocks(self, prompt_tokens: int, max_tokens: int, samples: int) -> int:
        """Most blocks one request may hold or be promised at once (more than the pool: it never
        runs)."""
        return blocks_for(self._capped(prompt_tokens + max_tokens), self.block_size)

    def slots_at_admission(self, num_tokens: int, scheduled_end: int) -> int:
        """Leading tokens of a ``num_tokens``-token sequence that get KV slots at its admission, its
        first chunk ending at token ``scheduled_end``: all of them (prompt, or a recompute) here."""
        return num_tokens

    def admit(
        self, allocator: BlockAllocator, seq: EngineSequence, upto: int | None = None
    ) -> bool:
        """Phase 1: reserve the blocks of the uncached tokens among the first ``upto`` (None: all of
        them) plus the output promise; False (nothing reserved) when the unreserved headroom is too
        small."""
        need = allocator.num_blocks_to_allocate(seq.token_ids[:upto], seq.namespace)
        return allocator.reserve(
            seq.seq_id,
            need + self.output_blocks(seq.num_tokens, seq.remaining_tokens, seq.batch_slots),
        )

    def keep_output_promise(self, allocator: BlockAllocator, seq: EngineSequence) -> None:
        """Phase 2, once the prompt blocks are allocated: keep reserved exactly the output's
        promise."""
        allocator.release_reservation(seq.seq_id)
        allocator.reserve(
            seq.seq_id, self.output_blocks(seq.num_tokens, seq.remaining_tokens, seq.batch_slots)
        )

    def _capped(self, tokens: int) -> int:
        return tokens if self.max_model_len is None else min(tokens, self.max_model_len)


class UpFrontReservation(ReservationPolicy):
    """``"up-front"`` (as TGI): admission also reserves the blocks of ``max_tokens`` more tokens per
    sample (capped at ``max_model_len``), plus a copy-on-write block each when ``n > 1`` samples
    share a partly filled prompt tail, so a running request never meets an empty pool."""

    name = "up-front"
    preempts = False

    def output_blocks(self, num_tokens: int, remaining_tokens: int, samples: int) -> int:
        """Blocks promised for ``remaining_tokens`` more tokens per sample beyond the ``num_tokens``
        there."""
        final = self._capped(num_tokens + remaining_tokens)
        cow = 1 if samples > 1 and num_tokens % self.block_size else 0
        return samples * (
            blocks_for(final, self.block_size) - blocks_for(num_tokens, self.block_size) + cow
        )

    def worst_case_blocks(self, prompt_tokens: int, max_tokens: int, samples: int) -> int:
        """The prompt's blocks plus the whole output promise, held at once from admission."""
        return blocks_for(prompt_tokens, self.block_size) + self.output_blocks(
            prompt_tokens, max_tokens, samples
        )


class PerStepAllocation(ReservationPolicy):
    """``"per-step"`` (vLLM V1): no reservation step. Admission allocates only the slots of the
    first chunk the step schedules (after the prefix-cache hit); every later step allocates those
    of the tokens it schedules (the next prefill chunk or a decode token), and a running request
    whose allocation fails preempts the lowest-ranked running one by recompute. In vLLM
    (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``) the running and the waiting loop
    both call ``KVCacheManager.allocate_slots(request, num_new_tokens, ...)``
    (``vllm/v1/core/kv_cache_manager.py``), which returns None when the free blocks are too few: a
    waiting request then stays queued, a running one pops ``self.running`` and ``_preempt_request``
    frees its blocks and sets ``num_computed_tokens = 0``."""

    name = "per-step"

    def slots_at_admission(self, num_tokens: int, scheduled_end: int) -> int:
        """Only the tokens of the first scheduled chunk, up to ``scheduled_end``."""
        return scheduled_end


RESERVATIONS: dict[str, type[ReservationPolicy]] = {
    "on-demand": ReservationPolicy, "up-front": UpFrontReservation, "per-step": PerStepAllocation}
assert tuple(RESERVATIONS) == RESERVATION_POLICIES


def reservation_policy(
    name: str, block_size: int, max_model_len: int | None = None
) -> ReservationPolicy:
    """The rule called ``name`` (one of :data:`~servelab.engine.config.RESERVATION_POLICIES`, as
    ``EngineConfig`` checked it) for a pool of ``block_size``-token blocks and a context limit of
    ``max_model_len`` tokens (None: no cap)."""
    return RESERVATIONS[name](block_size, max_model_len)
