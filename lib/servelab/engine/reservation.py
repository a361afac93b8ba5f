"""The admission rule: how many KV blocks a request must be promised before the scheduler admits it.

``EngineConfig.reservation_policy`` names one of :data:`RESERVATION_POLICIES`:

* ``"on-demand"`` (the default, as vLLM): reserve the blocks of the prompt's uncached part; the output
  grows block by block from unreserved headroom, and a decode step that finds no free block preempts
  the lowest-ranked running sequence. Many requests fit at once; under pressure some are preempted.
* ``"up-front"`` (as a token-budget server such as TGI): reserve the prompt's blocks *plus* the blocks
  of ``max_tokens`` more tokens (per sample, with a copy-on-write block each when ``n > 1`` shares a
  partial tail) at admission. Every block a request can ever need is promised before it starts, so a
  running request never meets an empty pool and is never preempted; fewer requests fit at once.

Two-phase admission (the lifecycle's QUEUED -> PREFILL): :meth:`ReservationPolicy.admit` reserves the
whole promise, ``allocate_prompt`` then takes the prompt blocks out of it, and
:meth:`ReservationPolicy.keep_output_promise` leaves reserved exactly the output blocks still promised.
Decode appends consume that remainder first. Whatever is left is released on every exit path
(finish, cancel, deadline, failure, preemption), because ``BlockAllocator.free`` drops a sequence's
reservation with its blocks.

System boundary: block counts only; the allocator does the bookkeeping, the scheduler decides when.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.engine.sequence import Sequence
from servelab.kv.allocator import BlockAllocator
from servelab.kv.arithmetic import blocks_for

RESERVATION_POLICIES = ("on-demand", "up-front")


@dataclass(frozen=True)
class ReservationPolicy:
    """One engine's admission rule: ``name`` from :data:`RESERVATION_POLICIES`, blocks of ``block_size``
    token slots, ``max_model_len`` the context limit in tokens (None: no cap)."""

    name: str
    block_size: int
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.name not in RESERVATION_POLICIES:
            raise ValueError(f"reservation_policy must be one of {RESERVATION_POLICIES}, got {self.name!r}")

    @property
    def preempts(self) -> bool:
        """Whether running requests may be preempted for KV (only under on-demand growth)."""
        return self.name == "on-demand"

    def output_blocks(self, num_tokens: int, remaining_tokens: int, samples: int) -> int:
        """Blocks promised for the output beyond the blocks of the ``num_tokens`` already there: 0 on
        demand; up front, for each of ``samples`` samples the blocks of ``remaining_tokens`` more tokens
        (capped at ``max_model_len``) plus a copy-on-write block when several samples share a partial tail."""
        if self.preempts:
            return 0
        final = num_tokens + remaining_tokens
        if self.max_model_len is not None:
            final = min(final, self.max_model_len)
        cow = 1 if samples > 1 and num_tokens % self.block_size else 0
        return samples * (blocks_for(final, self.block_size) - blocks_for(num_tokens, self.block_size) + cow)

    def worst_case_blocks(self, prompt_tokens: int, max_tokens: int, samples: int) -> int:
        """Most blocks one request may hold or be promised at once: a request needing more than the
        pool can never run. On demand the longest sequence (samples share their prompt and may be
        preempted); up front the whole promise."""
        if self.preempts:
            longest = prompt_tokens + max_tokens
            if self.max_model_len is not None:
                longest = min(longest, self.max_model_len)
            return blocks_for(longest, self.block_size)
        return blocks_for(prompt_tokens, self.block_size) + self.output_blocks(prompt_tokens, max_tokens, samples)

    def admit(self, allocator: BlockAllocator, seq: Sequence) -> bool:
        """Phase 1: reserve the uncached prompt blocks (plus the output promise, up front). False, with
        nothing reserved, when the pool's unreserved headroom is too small: the request waits."""
        need = allocator.num_blocks_to_allocate(seq.token_ids, seq.namespace)
        need += self.output_blocks(seq.num_tokens, seq.remaining_tokens, seq.batch_slots)
        return allocator.reserve(seq.seq_id, need)

    def keep_output_promise(self, allocator: BlockAllocator, seq: Sequence) -> None:
        """Phase 2, once the prompt blocks are allocated (and copies done): keep reserved exactly the
        output blocks still promised (none on demand)."""
        allocator.release_reservation(seq.seq_id)
        allocator.reserve(seq.seq_id, self.output_blocks(seq.num_tokens, seq.remaining_tokens, seq.batch_slots))

    def split_at_fork(self, allocator: BlockAllocator, parent: Sequence, children: list[Sequence]) -> None:
        """Parallel sampling: the parent's promise (made for all ``n`` samples) is shared out evenly, so
        each sample's own appends draw on its own part."""
        total = allocator.release_reservation(parent.seq_id)
        share = total // (1 + len(children))
        for child in children:
            allocator.reserve(child.seq_id, share)
        allocator.reserve(parent.seq_id, total - share * len(children))
