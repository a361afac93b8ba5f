"""The exercises' reference solutions: instructor-only, never in the ``servelab`` wheel.

Each one implements an exercise's student interface with the library's own mechanism. The batch
grader computes its hidden cases' expected values with them (:mod:`servelab.exercises.expected`),
and :mod:`servelab_instructor.public_expected` writes the public cases' expected values into the
student package. A student's install does not contain this module; the grader refuses its import in
graded code.

* :class:`ReferenceAllocator` -- the allocator interface on ``servelab.kv.BlockAllocator``.
* :func:`reference_tick` -- one continuous-batching tick (``servelab.scheduling.batching``'s
  continuous policy).
* :func:`reference_accept`, :func:`reference_residual` -- ``servelab.optimizations.speculative``'s
  accept/correct rule.
* :func:`reference_kv_bytes_per_token`, :func:`reference_max_requests` -- ``servelab.kv`` sizing.
* :func:`reference_admit` -- FCFS admission with KV reservations on ``BlockAllocator.reserve``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from servelab.kv import BlockAllocator, OutOfBlocks, kv_bytes_per_token, physical_blocks_no_sharing
from servelab.optimizations.speculative import acceptance_probability, residual_distribution

__all__ = [
    "ReferenceAllocator",
    "reference_accept",
    "reference_admit",
    "reference_kv_bytes_per_token",
    "reference_max_requests",
    "reference_residual",
    "reference_tick",
]


class ReferenceAllocator:
    """The allocator exercise's interface implemented with ``servelab.kv.BlockAllocator``."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self._pool = BlockAllocator(num_blocks, block_size, enable_prefix_caching=False)

    @property
    def num_free_blocks(self) -> int:
        return self._pool.num_free_blocks

    def allocate(self, seq_id: Hashable, num_tokens: int) -> list[int]:
        """Give ``seq_id`` a block table with ``num_tokens`` slots; MemoryError when the pool is
        short."""
        try:
            self._pool.allocate_prompt(seq_id, [0] * num_tokens)
        except OutOfBlocks as exc:
            raise MemoryError(str(exc)) from None
        return self._pool.block_table(seq_id)

    def append(self, seq_id: Hashable, num_tokens: int) -> None:
        """Add ``num_tokens`` slots, copying a shared partially filled tail block first."""
        try:
            self._pool.append_tokens(seq_id, [0] * num_tokens)
        except OutOfBlocks as exc:
            raise MemoryError(str(exc)) from None

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        self._pool.fork(parent_id, child_id)

    def free(self, seq_id: Hashable) -> int:
        return self._pool.free(seq_id)

    def block_table(self, seq_id: Hashable) -> list[int]:
        return self._pool.block_table(seq_id)

    def refcount(self, block: int) -> int:
        return self._pool.refcount(block)


def reference_tick(
    running: dict[str, int], queue: list[tuple[str, int]], capacity: int
) -> tuple[dict[str, int], list[tuple[str, int]], list[str]]:
    """One continuous-batching tick: refill free slots, emit one token each, retire finished
    requests."""
    free = max(capacity - len(running), 0)
    admitted, waiting = queue[:free], list(queue[free:])
    owed = {**running, **dict(admitted)}
    after = {name: left - 1 for name, left in owed.items()}
    finished = [name for name, left in after.items() if left == 0]
    return {n: left for n, left in after.items() if left > 0}, waiting, finished


def reference_accept(p: np.ndarray, q: np.ndarray, token: int) -> float:
    """``min(1, p[token] / q[token])``
    (``servelab.optimizations.speculative.acceptance_probability``)."""
    return acceptance_probability(p, q, int(token))


def reference_residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``norm(max(0, p - q))`` (``servelab.optimizations.speculative.residual_distribution``)."""
    return residual_distribution(p, q)


def reference_kv_bytes_per_token(n_layer: int, n_head: int, n_kv_head: int, d_head: int,
                                 bytes_per_elem: int) -> int:
    """KV bytes of one token: K and V for every layer and *KV* head (``n_head`` does not enter)."""
    return kv_bytes_per_token(n_layer, n_kv_head, d_head, bytes_per_elem)


def reference_max_requests(
    pool_bytes: int,
    bytes_per_token: int,
    block_size: int,
    prompt_tokens: int,
    max_output_tokens: int,
) -> int:
    """Requests whose full reservation (prompt + output, whole blocks) fits a pool of whole
    blocks."""
    pool_blocks = pool_bytes // (block_size * bytes_per_token)
    per_request = physical_blocks_no_sharing([prompt_tokens + max_output_tokens], block_size)
    return pool_blocks // per_request


def reference_admit(queue: Sequence[tuple[str, int, int]], pool_blocks: int, held_blocks: int,
                    block_size: int, free_slots: int) -> tuple[list[str], list[str]]:
    """FCFS admission with reservations: returns ``(admitted, rejected)``; the rest stays queued."""
    pool = BlockAllocator(pool_blocks, block_size, enable_prefix_caching=False)
    pool.reserve("running requests", held_blocks)
    admitted: list[str] = []
    rejected: list[str] = []
    for name, prompt_tokens, max_output_tokens in queue:
        need = physical_blocks_no_sharing([prompt_tokens + max_output_tokens], block_size)
        if need > pool_blocks:
            rejected.append(name)
            continue
        if len(admitted) == free_slots or not pool.reserve(name, need):
            break
        admitted.append(name)
    return admitted, rejected
