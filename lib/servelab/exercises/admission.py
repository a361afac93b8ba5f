"""Checker for the admission exercise: first come, first served, with KV reservations.

Student signature::

    def admit(queue: list[tuple[str, int, int]], pool_blocks: int, held_blocks: int,
              block_size: int, free_slots: int) -> tuple[list[str], list[str]]: ...

``queue`` holds waiting ``(name, prompt_tokens, max_output_tokens)`` requests in arrival order;
``pool_blocks`` is the KV pool's size in blocks of ``block_size`` token slots, ``held_blocks`` what
running requests already hold or have reserved, ``free_slots`` the batch slots left. ``admit``
returns ``(admitted, rejected)``: the names admitted this round, each with a reservation of
``ceil((prompt + max_output) / block_size)`` blocks, and the names refused outright because they
could never fit the whole pool. Everything else stays queued. The rules:

1. a request is admitted only if its whole reservation fits what is left (pool - held - reserved so
   far);
2. a reservation made this round shrinks what the next request can get;
3. first come, first served: once a request waits for room, every request behind it waits too;
4. a request larger than the whole pool is rejected (it would block the queue forever), and does not
   block the ones behind it;
5. an admitted request needs a batch slot as well as blocks.

The reference reserves with ``servelab.kv.BlockAllocator.reserve``, as the engine's scheduler does;
the public cases' expected values are committed data (:mod:`servelab.exercises.expected`).
"""

from __future__ import annotations

from collections.abc import Callable

from servelab.exercises.expected import paired, public_expected, reference
from servelab.exercises.hidden import hidden_rng, renamer
from servelab.exercises.result import Case, CaseFailure, CheckResult, run_cases
from servelab.prose import count

__all__ = ["check_admission", "expected_from_reference"]

Admit = Callable[[list[tuple[str, int, int]], int, int, int, int], tuple[list[str], list[str]]]

# (rule, (queue, pool_blocks, held_blocks, block_size, free_slots), points)
ADMISSION_CASES = (
    ("a reservation covers the prompt and the whole output allowance",
     ([("A", 20, 30), ("B", 4, 4)], 4, 0, 16, 4), 2),
    ("a reservation made this round shrinks what the next request can get",
     ([("A", 16, 16), ("B", 16, 16), ("C", 16, 16)], 5, 0, 16, 4), 2),
    ("blocks held by running requests are not free",
     ([("A", 32, 0), ("B", 16, 0)], 6, 4, 16, 4), 1),
    ("first come, first served: a request that must wait blocks the ones behind it",
     ([("A", 16, 16), ("B", 16, 48), ("C", 8, 8)], 5, 0, 16, 4), 2),
    ("a request larger than the whole pool is rejected, not queued forever",
     ([("A", 100, 100), ("B", 16, 0)], 8, 0, 16, 4), 2),
    ("an admitted request needs a batch slot as well as blocks",
     ([("A", 8, 8), ("B", 8, 8), ("C", 8, 8)], 16, 0, 16, 2), 1),
)


def hidden_cases(seed: int) -> tuple:
    """The public rules with fresh names, and the block size and every token count scaled by 1, 2 or
    4 (the same blocks per request, so every rule still holds)."""
    rng = hidden_rng(seed, "admission")
    cases = []
    for rule, (queue, pool_blocks, held, block_size, slots), points in ADMISSION_CASES:
        k, names = rng.choice((1, 2, 4)), renamer(rng, [name for name, _, _ in queue])
        scaled = [(names[name], prompt * k, output * k) for name, prompt, output in queue]
        cases.append((rule, (scaled, pool_blocks, held, block_size * k, slots), points))
    return tuple(cases)


def expected_from_reference(cases: tuple) -> list[list[list[str]]]:
    """The reference's ``[admitted, rejected]`` for every case of a table."""
    admit = reference().reference_admit
    return [[list(names) for names in admit(list(args[0]), *args[1:])] for _, args, _ in cases]


def _table(seed: int | None) -> list[tuple]:
    """The cases of ``seed`` (public when None), each paired with its expected ``(admitted,
    rejected)``."""
    cases = ADMISSION_CASES if seed is None else hidden_cases(seed)
    values = public_expected("admission") if seed is None else expected_from_reference(cases)
    return [
        (case, (admitted, rejected))
        for case, (admitted, rejected) in paired("admission", cases, values)
    ]


def _steps(queue: list, pool_blocks: int, held: int, block_size: int) -> str:
    left, parts = pool_blocks - held, []
    for name, prompt, output in queue:
        need = -(-(prompt + output) // block_size)
        parts.append(
            f"{name} needs ceil(({prompt} + {output}) / {block_size}) = {count(need, 'block')}"
        )
    return f"steps: {pool_blocks} blocks - {held} held = {left} available; " + "; ".join(parts)


def _case(admit: Admit, args: tuple, expected: tuple[list[str], list[str]]) -> None:
    queue, pool_blocks, held, block_size, slots = args
    got = admit(list(queue), pool_blocks, held, block_size, slots)
    got_norm = (
        (list(got[0]), list(got[1])) if isinstance(got, (tuple, list)) and len(got) == 2 else got
    )
    if got_norm != expected:
        call = (f"admit({list(queue)}, pool_blocks={pool_blocks}, held_blocks={held}, "
                f"block_size={block_size}, free_slots={slots})")
        raise CaseFailure(
            f"{call} returned (admitted, rejected) = {got_norm!r}, expected {expected!r}\n"
            f"{_steps(queue, pool_blocks, held, block_size)}"
        )


def check_admission(admit: Admit, verbose: bool = True, seed: int | None = None) -> CheckResult:
    """Run the admission cases (public, or the hidden ones of ``seed``) against FCFS with
    reservations."""
    cases = [Case(rule, lambda a=args, e=expected: _case(admit, a, e), points)
             for (rule, args, points), expected in _table(seed)]
    return run_cases("admission with reservations", cases, verbose)


def worked_example() -> str:
    """The shrinking-reservation case (public) and what a correct ``admit`` returns."""
    (_, (queue, pool_blocks, held, block_size, slots), _), (admitted, rejected) = _table(None)[1]
    return (
        f"admit({queue}, pool_blocks={pool_blocks}, held_blocks={held}, block_size={block_size}, "
        f"free_slots={slots})\n-> admitted {admitted}, rejected {rejected}\n"
        f"{_steps(queue, pool_blocks, held, block_size)}"
    )
