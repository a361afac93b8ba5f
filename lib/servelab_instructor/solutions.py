"""Every exercise's solution under the student's interface, for grading the grader itself.

:data:`SOLUTIONS` maps each exercise stem (``servelab.exercises.catalog.EXERCISES``) to the objects
a correct submission defines, in the order its checkers take them: the reference solutions of
:mod:`servelab_instructor.reference` where the checkers have one, the library's own mechanism for
the others, and three written here in the plain style a student would use
(:func:`reference_goodput`, on the records a student receives, :func:`reference_schedule`,
:func:`reference_paged_attention`). A grader that fails any of them on any seed fails correct work.
"""

from __future__ import annotations

import torch

from servelab.kv import blocks_for
from servelab.sampling import min_p_filter, top_p_filter
from servelab.sampling.stop_strings import StopStringBuffer
from servelab_instructor.reference import (ReferenceAllocator, reference_accept, reference_admit,
                                           reference_kv_bytes_per_token, reference_max_requests,
                                           reference_residual, reference_tick)

__all__ = ["SOLUTIONS", "reference_goodput", "reference_paged_attention", "reference_schedule"]

Seq = tuple[str, int, int, int]


def reference_schedule(running: list[Seq], waiting: list[Seq], free_blocks: int, block_size: int,
                       token_budget: int, max_num_seqs: int) -> list[tuple[str, int]]:
    """One scheduler tick, no preemption: running first (one short of blocks is skipped), then FCFS
    admission while slots, budget and blocks last (the first that does not fit stops it)."""
    plan: list[tuple[str, int]] = []
    budget, free = token_budget, free_blocks
    for admitted, (rid, computed, tokens, blocks) in enumerate([*running, *waiting]):
        is_waiting = admitted >= len(running)
        if budget == 0 or (is_waiting and admitted >= max_num_seqs):
            break
        n = min(tokens - computed, budget)
        need = max(0, blocks_for(computed + n, block_size) - blocks)
        if need > free:
            if is_waiting:
                break
            continue
        plan.append((rid, n))
        budget, free = budget - n, free - need
    return plan


def reference_goodput(
    records: list, ttft_slo: float, tpot_slo: float, window: tuple[float, float]
) -> float:
    """Requests per second finishing inside ``window`` that met both SLOs (no TPOT for one
    token)."""
    start, end = window
    good = [r for r in records if start <= r.finish <= end and r.ttft <= ttft_slo
            and (r.tpot is None or r.tpot <= tpot_slo)]
    return len(good) / (end - start)


def reference_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              block_table: list[int], positions: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention of ``q`` over the context gathered through ``block_table``."""
    block_size, length = k_cache.shape[1], int(positions[-1]) + 1
    p = torch.arange(length)
    physical = torch.tensor(block_table)[p // block_size]
    k, v = k_cache[physical, p % block_size], v_cache[physical, p % block_size]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,lhd->htl", q, k) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(p[None, None, :] > positions[None, :, None], float("-inf"))
    return torch.einsum("htl,lhd->thd", scores.softmax(dim=-1), v)


SOLUTIONS: dict[str, tuple] = {
    "ex01-sampling-filters": (top_p_filter, min_p_filter),
    "ex02-stop-buffer": (StopStringBuffer,),
    "ex03-block-allocator": (ReferenceAllocator,),
    "ex04-batching-tick": (reference_tick,),
    "ex05-goodput": (reference_goodput,),
    "ex06-speculative": (reference_accept, reference_residual),
    "ex07-kv-sizing": (reference_kv_bytes_per_token, reference_max_requests),
    "ex08-admission": (reference_admit,),
    "ex09-paged-attention": (reference_paged_attention,),
    "ex10-scheduler-tick": (reference_schedule,),
}
