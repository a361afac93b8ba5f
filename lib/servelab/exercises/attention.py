"""Checker for the paged-attention exercise: causal attention read through a block table.

Student signature::

    def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        block_table: list[int], positions: torch.Tensor) -> torch.Tensor: ...

``q`` is ``[T, n_heads, head_dim]``: the queries of ``T`` consecutive tokens of one sequence at the
absolute ``positions`` (a 1-D long tensor, e.g. ``arange(start, start + T)``), whose own K/V are
already written. ``k_cache``/``v_cache`` are one layer's pool, ``[num_blocks, block_size,
n_kv_heads, head_dim]``; the token at position ``p`` lives at
``k_cache[block_table[p // block_size], p % block_size]``. The answer is ``[T, n_heads, head_dim]``:
query ``t`` attends with ``softmax(q . k / sqrt(head_dim))`` to the keys at positions
``0 .. positions[t]``, and query head ``h`` reads KV head ``h // (n_heads // n_kv_heads)``
(grouped-query attention).

The oracle is not a paged implementation: each case draws contiguous K, V ``[L, n_kv_heads,
head_dim]`` from a seeded generator, scatters them into a pool along the case's block table, fills
every other slot of the pool with large finite garbage, and compares the student's answer with
``torch.nn.functional.scaled_dot_product_attention`` on the contiguous K, V under an explicit causal
mask (key ``j`` visible to query ``t`` iff ``j <= positions[t]``). Float32 on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from servelab.exercises.hidden import hidden_rng
from servelab.exercises.result import Case, CaseFailure, CheckResult, run_cases

__all__ = ["PagedCase", "check_paged_attention", "expected_attention", "scatter_into_pool"]

PagedAttention = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, list[int], torch.Tensor], torch.Tensor
]

ATOL, RTOL = 1e-5, 1e-4
GARBAGE_SCALE = 1e3  # unused slots hold 1e3 * randn: finite, never NaN or inf, and loud if read


@dataclass(frozen=True)
class PagedCase:
    """One hidden case: ``T`` queries from position ``start`` over a pool of ``num_blocks``
    blocks."""

    rule: str
    start: int
    T: int
    block_table: tuple[int, ...]
    num_blocks: int
    block_size: int = 4
    n_heads: int = 2
    n_kv_heads: int = 2
    head_dim: int = 8
    points: int = 1


CASES = (
    PagedCase("one decode token attends to every position up to its own", 9, 1, (2, 0, 3), 6),
    PagedCase("a whole prompt from position 0 is causal", 0, 7, (1, 4), 6),
    PagedCase(
        "a chunk in the middle sees the cached prefix and is causal inside",
        5,
        4,
        (3, 0, 5),
        6,
        points=2,
    ),
    PagedCase(
        "the block table maps logical blocks to physical ones, in any order",
        8,
        3,
        (5, 2, 7),
        8,
        points=2,
    ),
    PagedCase(
        "a context that ends exactly on a block boundary reads its last slot", 6, 2, (6, 1), 8
    ),
    PagedCase(
        "one position past a block boundary reads the next block's first slot", 7, 2, (6, 1, 3), 8
    ),
    PagedCase(
        "grouped-query attention: query head h reads KV head h // (n_heads // n_kv_heads)",
        3,
        3,
        (2, 0),
        4,
        n_heads=6,
        n_kv_heads=2,
        points=2,
    ),
    PagedCase("the unwritten tail of the last block never leaks into the answer", 2, 3, (1, 3), 4),
)


def hidden_cases(seed: int) -> tuple[tuple[int, PagedCase], ...]:
    """``(tensor seed, case)`` pairs for ``seed``: each public case with new random tensors and its
    logical blocks mapped to other distinct physical blocks of the same pool."""
    rng = hidden_rng(seed, "paged_attention")
    out = []
    for case in CASES:
        physical = rng.sample(range(case.num_blocks), len(case.block_table))
        out.append((rng.randrange(2**31), replace(case, block_table=tuple(physical))))
    return tuple(out)


def scatter_into_pool(k: torch.Tensor, block_table: list[int], num_blocks: int, block_size: int,
                      generator: torch.Generator) -> torch.Tensor:
    """A pool ``[num_blocks, block_size, n_kv, d]`` holding ``k`` ``[L, n_kv, d]`` along
    ``block_table``.

    Position ``p`` goes to ``pool[block_table[p // block_size], p % block_size]``; every other slot
    holds ``GARBAGE_SCALE * randn`` drawn from ``generator``.
    """
    pool = GARBAGE_SCALE * torch.randn(num_blocks, block_size, *k.shape[1:], generator=generator)
    p = torch.arange(k.shape[0])
    pool[torch.tensor(block_table)[p // block_size], p % block_size] = k
    return pool


def expected_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Causal attention of ``q`` ``[T, H, d]`` over contiguous ``k``, ``v`` ``[L, n_kv, d]`` ->
    ``[T, H, d]``.

    Key ``j`` is visible to query ``t`` iff ``j <= positions[t]``; each KV head serves
    ``H // n_kv`` consecutive query heads (the KV heads are repeated, as ``enable_gqa=True`` does).
    """
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    mask = torch.arange(k.shape[0])[None, :] <= positions[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
    )
    return out.transpose(0, 1)


def _inputs(case: PagedCase, seed: int) -> tuple[torch.Tensor, ...]:
    """Seeded ``q``, contiguous ``k``, ``v``, their pools and the positions of one case."""
    gen = torch.Generator().manual_seed(seed)
    length = case.start + case.T
    q = torch.randn(case.T, case.n_heads, case.head_dim, generator=gen)
    k = torch.randn(length, case.n_kv_heads, case.head_dim, generator=gen)
    v = torch.randn(length, case.n_kv_heads, case.head_dim, generator=gen)
    table = list(case.block_table)
    k_cache = scatter_into_pool(k, table, case.num_blocks, case.block_size, gen)
    v_cache = scatter_into_pool(v, table, case.num_blocks, case.block_size, gen)
    return q, k, v, k_cache, v_cache, torch.arange(case.start, length)


def _call_text(case: PagedCase) -> str:
    shape = (
        f"[{case.num_blocks} blocks, {case.block_size} slots, {case.n_kv_heads} KV heads, "
        f"{case.head_dim}]"
    )
    return (
        f"paged_attention(q [T={case.T}, {case.n_heads} heads, {case.head_dim}], "
        f"k_cache/v_cache {shape}, "
        f"block_table={list(case.block_table)}, "
        f"positions={list(range(case.start, case.start + case.T))})"
    )


def _compare(case: PagedCase, got: object, expected: torch.Tensor, positions: torch.Tensor) -> None:
    """Raise :class:`CaseFailure` naming the first query position whose output is wrong."""
    if not isinstance(got, torch.Tensor):
        raise CaseFailure(
            f"{_call_text(case)} returned a {type(got).__name__}, expected a torch.Tensor"
        )
    if tuple(got.shape) != tuple(expected.shape):
        raise CaseFailure(f"{_call_text(case)} returned shape {list(got.shape)}, expected "
                          f"[T, n_heads, head_dim] = {list(expected.shape)}")
    got = got.detach().to(torch.float32)
    bad = ~torch.isclose(got, expected, atol=ATOL, rtol=RTOL).flatten(1).all(dim=1)
    if bad.any():
        t = int(bad.nonzero()[0])
        err = (got[t] - expected[t]).abs()
        head = int(err.amax(dim=1).argmax())
        raise CaseFailure(
            f"{_call_text(case)}: the query at position {int(positions[t])} (row t={t}) is off by "
            f"up to {float(err.max()):.3g} (max abs error, worst in query head {head}); expected "
            f"attention over positions 0..{int(positions[t])}; {int(bad.sum())} of {case.T} "
            "rows are wrong"
        )


def _run(paged_attention: PagedAttention, case: PagedCase, seed: int) -> None:
    q, k, v, k_cache, v_cache, positions = _inputs(case, seed)
    expected = expected_attention(q, k, v, positions)
    got = paged_attention(
        q.clone(), k_cache.clone(), v_cache.clone(), list(case.block_table), positions.clone()
    )
    _compare(case, got, expected, positions)


def check_paged_attention(paged_attention: PagedAttention, verbose: bool = True,
                          seed: int | None = None) -> CheckResult:
    """Run the cases (public, or the hidden ones of ``seed``) against causal attention on contiguous
    K, V."""
    table = tuple(enumerate(CASES)) if seed is None else hidden_cases(seed)
    cases = [Case(c.rule, lambda c=c, s=tensor_seed: _run(paged_attention, c, s), c.points)
             for tensor_seed, c in table]
    return run_cases("paged attention", cases, verbose)


def _rows(x: torch.Tensor, spec: str = ".4f") -> str:
    return (
        "["
        + ", ".join("[" + ", ".join(f"{value:{spec}}" for value in row) + "]" for row in x.tolist())
        + "]"
    )


def worked_example() -> str:
    """Two queries at positions 2 and 3, one head of size 2, block size 2, block table [3, 1]."""
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [0.0, -1.0]], dtype=torch.float64)
    q = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    positions = torch.tensor([2, 3])
    out = expected_attention(q[:, None], k[:, None], v[:, None], positions)[:, 0]
    return "\n".join(
        [
            "block_size = 2, block_table = [3, 1]: positions 0, 1 live in block 3, "
            "positions 2, 3 in block 1",
            f"k_cache[3] = {_rows(k[:2], 'g')}, k_cache[1] = {_rows(k[2:], 'g')}  (one KV "
            f"head, head_dim 2)",
            f"v_cache[3] = {_rows(v[:2], 'g')}, v_cache[1] = {_rows(v[2:], 'g')}",
            f"q = {_rows(q, 'g')}  (one query head), positions = [2, 3]",
            f"paged_attention(q, k_cache, v_cache, [3, 1], positions)\n-> {_rows(out)}",
            "(the query at position 2 does not see position 3; every other slot of the "
            "pool is never read)",
        ]
    )
