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

When the pool is short, ``allocate``/``append`` raise ``MemoryError`` and change nothing. The
reference is ``servelab.kv.BlockAllocator`` (prefix caching off) behind the same interface, in the
instructor-only package; the public scenarios' expected steps are committed data
(:mod:`servelab.exercises.expected`), replayed from the reference by :func:`trace`. After every
operation the checker compares the free-block count, the operation's result and, for every live
sequence, the refcounts along its block table; a failure names the rule the scenario tests and lists
every step before the failing one with what it returned.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from servelab.exercises.expected import paired, public_expected, reference
from servelab.exercises.hidden import hidden_rng, renamer
from servelab.exercises.result import Case, CaseFailure, CheckResult, run_cases
from servelab.prose import count

__all__ = ["check_block_allocator", "expected_from_reference", "trace"]


# A scenario is (rule, pool blocks, block size, operations, points); an operation is (method,
# *arguments).
SCENARIOS = (
    ("a table rounds up to whole blocks", 8, 4, [("allocate", "A", 5), ("allocate", "B", 4)], 1),
    ("fork shares every block", 8, 4, [("allocate", "A", 6), ("fork", "A", "B")], 1),
    (
        "a shared block returns only with its last holder", 8, 4,
        [("allocate", "A", 6), ("fork", "A", "B"), ("free", "A"), ("free", "B")], 2,
    ),
    (
        "append into a shared partial tail copies it first", 8, 4,
        [("allocate", "A", 6), ("fork", "A", "B"), ("append", "B", 1), ("free", "A")], 2,
    ),
    (
        "append after a full shared tail takes a new block", 8, 4,
        [("allocate", "A", 8), ("fork", "A", "B"), ("append", "B", 1), ("append", "A", 3)], 2,
    ),
    ("a short pool raises MemoryError and changes nothing", 4, 4,
     [("allocate", "A", 12), ("allocate", "B", 8)], 1),
    ("freeing twice is a no-op", 4, 2, [("allocate", "A", 3), ("free", "A"), ("free", "A")], 1),
)


def hidden_scenarios(seed: int) -> tuple:
    """The public scenarios with fresh sequence ids and the block size and allocated tokens scaled
    by 1, 2 or 4 (the same blocks, full or partial tails, so every rule still holds)."""
    rng = hidden_rng(seed, "block_allocator")
    scenarios = []
    for rule, n, block_size, ops, points in SCENARIOS:
        k = rng.choice((1, 2, 4))
        names = renamer(rng, sorted({a for op in ops for a in op[1:] if isinstance(a, str)}))
        renamed = [tuple(names.get(a, a) if isinstance(a, str) else a for a in op) for op in ops]
        scaled = [(op[0], op[1], op[2] * k) if op[0] == "allocate" else op for op in renamed]
        scenarios.append((rule, n, block_size * k, scaled, points))
    return tuple(scenarios)


def _apply(alloc: object, op: tuple) -> object:
    """Run one operation; return a comparable outcome (table length, freed count, or the error
    type)."""
    method, *args = op
    try:
        result = getattr(alloc, method)(*args)
    except MemoryError:
        return "MemoryError"
    return len(result) if method == "allocate" else result if method == "free" else None


def _state(alloc: object, live: list[Hashable]) -> tuple[int, dict[Hashable, list[int]]]:
    tables = {s: [alloc.refcount(b) for b in alloc.block_table(s)] for s in live}
    return alloc.num_free_blocks, tables


def _live_after(live: list[Hashable], op: tuple, outcome: object) -> list[Hashable]:
    """The sequences holding blocks after ``op`` had ``outcome``."""
    if op[0] in ("allocate", "fork") and outcome != "MemoryError":
        return [*live, op[-1] if op[0] == "fork" else op[1]]
    return [s for s in live if s != op[1]] if op[0] == "free" else live


def trace(alloc: object, ops: list) -> list[dict]:
    """Replay ``ops`` on ``alloc``: after each step its ``result``, ``free`` blocks and the
    ``refcounts`` along every live sequence's block table (what a correct allocator must show)."""
    live: list[Hashable] = []
    steps = []
    for op in ops:
        outcome = _apply(alloc, op)
        live = _live_after(live, op, outcome)
        free, refcounts = _state(alloc, live)
        steps.append({"result": outcome, "free": free, "refcounts": refcounts})
    return steps


def expected_from_reference(scenarios: tuple) -> list[list[dict]]:
    """The reference allocator's :func:`trace` of every scenario of a table."""
    allocator = reference().ReferenceAllocator
    return [trace(allocator(n, block_size), ops) for _, n, block_size, ops, _ in scenarios]


def _table(seed: int | None) -> list[tuple]:
    """The scenarios of ``seed`` (public when None), each paired with its expected steps."""
    scenarios = SCENARIOS if seed is None else hidden_scenarios(seed)
    values = (
        public_expected("block_allocator") if seed is None else expected_from_reference(scenarios)
    )
    return paired("block_allocator", scenarios, values)


def _call_text(op: tuple) -> str:
    method, *args = op
    return f"{method}({', '.join(map(repr, args))})"


def _history(done: list[str]) -> str:
    if not done:
        return "it was the first step"
    return "steps before it:\n" + "\n".join(f"  {line}" for line in done)


def _run_scenario(
    student_cls: Callable[[int, int], object],
    num_blocks: int,
    block_size: int,
    ops: list,
    expected: list[dict],
) -> None:
    """Replay ``ops`` on the student's allocator; at the first difference from the ``expected``
    steps, fail with the steps that led there."""
    student = student_cls(num_blocks, block_size)
    live: list[Hashable] = []
    done: list[str] = []
    for step, (op, right) in enumerate(zip(ops, expected, strict=True), 1):
        got = _apply(student, op)
        call = f"step {step} {_call_text(op)} on a pool of {num_blocks} blocks x {block_size} slots"
        if got != right["result"]:
            raise CaseFailure(
                f"{call} gave {got!r}, expected {right['result']!r}; {_history(done)}"
            )
        live = _live_after(live, op, got)
        got_free, got_refs = _state(student, live)
        if got_free != right["free"]:
            raise CaseFailure(
                f"after {call}: {got_free} free blocks, expected {right['free']}; {_history(done)}"
            )
        if got_refs != right["refcounts"]:
            raise CaseFailure(
                f"after {call}: refcounts along the block tables {got_refs}, expected "
                f"{right['refcounts']}; {_history(done)}"
            )
        done.append(
            f"step {step} {_call_text(op)} -> {got!r}, {got_free} free blocks, refcounts {got_refs}"
        )


def check_block_allocator(allocator_cls: Callable[[int, int], object], verbose: bool = True,
                          seed: int | None = None) -> CheckResult:
    """Run the allocator scenarios (public, or the hidden ones of ``seed``) against the expected
    steps."""
    cases = [
        Case(
            rule,
            lambda n=n, bs=bs, ops=ops, e=expected: _run_scenario(allocator_cls, n, bs, ops, e),
            points,
        )
        for (rule, n, bs, ops, points), expected in _table(seed)
    ]
    return run_cases("block allocator", cases, verbose)


def worked_example() -> str:
    """The first public scenario: what a correct allocator returns, step by step."""
    (_, n, _, ops, _), expected = _table(None)[0]
    return "\n".join(
        f"{_call_text(op)} -> table of {count(right['result'], 'block')}; {right['free']} "
        f"of {n} blocks free"
        for op, right in zip(ops, expected)
    )
