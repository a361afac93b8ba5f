"""Checker for the block-allocator exercise: paged KV blocks with reference counts.

Student interface (a class; block ids are the student's own choice)::

    class Allocator:
        def __init__(self, num_blocks: int, block_size: int) -> None: ...
        num_free_blocks: int                               # attribute or property
        def allocate(self, seq_id, num_tokens: int) -> list[int]: ...   # new block table
        def append(self, seq_id, num_tokens: int) -> None: ...  # grow; copy a shared partial tail first
        def fork(self, parent_id, child_id) -> None: ...        # child shares every block (refcount + 1)
        def free(self, seq_id) -> int: ...       # blocks returned to the pool; unknown seq_id -> 0
        def block_table(self, seq_id) -> list[int]: ...
        def refcount(self, block: int) -> int: ...

When the pool is short, ``allocate``/``append`` raise ``MemoryError`` and change nothing. The reference
is ``servelab.kv.BlockAllocator`` (prefix caching off) behind the same interface:
:class:`ReferenceAllocator`. After every operation the checker compares the free-block count, the
operation's result and, for every live sequence, the refcounts along its block table.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from servelab.exercises.result import CaseFailure, CheckResult, run_cases
from servelab.kv import BlockAllocator, OutOfBlocks

__all__ = ["ReferenceAllocator", "check_block_allocator"]


class ReferenceAllocator:
    """The exercise interface implemented with ``servelab.kv.BlockAllocator`` (the instructor's solution)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self._pool = BlockAllocator(num_blocks, block_size, enable_prefix_caching=False)

    @property
    def num_free_blocks(self) -> int:
        return self._pool.num_free_blocks

    def allocate(self, seq_id: Hashable, num_tokens: int) -> list[int]:
        """Give ``seq_id`` a block table with ``num_tokens`` slots; MemoryError when the pool is short."""
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


# A scenario is (pool blocks, block size, operations); an operation is (method, *arguments).
SCENARIOS = (
    ("a table rounds up to whole blocks", 8, 4, [("allocate", "A", 5), ("allocate", "B", 4)]),
    ("fork shares every block", 8, 4, [("allocate", "A", 6), ("fork", "A", "B")]),
    (
        "a shared block returns only with its last holder", 8, 4,
        [("allocate", "A", 6), ("fork", "A", "B"), ("free", "A"), ("free", "B")],
    ),
    (
        "append into a shared partial tail copies it first", 8, 4,
        [("allocate", "A", 6), ("fork", "A", "B"), ("append", "B", 1), ("free", "A")],
    ),
    (
        "append after a full shared tail takes a new block", 8, 4,
        [("allocate", "A", 8), ("fork", "A", "B"), ("append", "B", 1), ("append", "A", 3)],
    ),
    ("a short pool raises MemoryError and changes nothing", 4, 4, [("allocate", "A", 12), ("allocate", "B", 8)]),
    ("freeing twice is a no-op", 4, 2, [("allocate", "A", 3), ("free", "A"), ("free", "A")]),
)


def _apply(alloc: object, op: tuple) -> object:
    """Run one operation; return a comparable outcome (table length, freed count, or the error type)."""
    method, *args = op
    try:
        result = getattr(alloc, method)(*args)
    except MemoryError:
        return "MemoryError"
    return len(result) if method == "allocate" else result if method == "free" else None


def _state(alloc: object, live: list[Hashable]) -> tuple:
    tables = {s: [alloc.refcount(b) for b in alloc.block_table(s)] for s in live}
    return alloc.num_free_blocks, tables


def _run_scenario(student_cls: Callable[[int, int], object], num_blocks: int, block_size: int, ops: list) -> None:
    reference, student = ReferenceAllocator(num_blocks, block_size), student_cls(num_blocks, block_size)
    live: list[Hashable] = []
    for step, op in enumerate(ops, 1):
        expected, got = _apply(reference, op), _apply(student, op)
        call = f"step {step} {op[0]}{tuple(op[1:])} (pool {num_blocks} x {block_size} slots)"
        if got != expected:
            raise CaseFailure(f"{call} gave {got!r}, expected {expected!r}")
        if op[0] in ("allocate", "fork") and expected != "MemoryError":
            live.append(op[-1] if op[0] == "fork" else op[1])
        if op[0] == "free":
            live = [s for s in live if s != op[1]]
        (exp_free, exp_refs), (got_free, got_refs) = _state(reference, live), _state(student, live)
        if got_free != exp_free:
            raise CaseFailure(f"after {call}: {got_free} free blocks, expected {exp_free}")
        if got_refs != exp_refs:
            raise CaseFailure(f"after {call}: refcounts along the block tables {got_refs}, expected {exp_refs}")


def check_block_allocator(allocator_cls: Callable[[int, int], object], verbose: bool = True) -> CheckResult:
    """Run the hidden allocator scenarios against :class:`ReferenceAllocator`."""
    cases = [
        (label, lambda n=n, bs=bs, ops=ops: _run_scenario(allocator_cls, n, bs, ops))
        for label, n, bs, ops in SCENARIOS
    ]
    return run_cases("block allocator", cases, verbose)
