"""Checker for the scheduler-tick exercise: token budget, block budget and chunked prefill.

Student signature::

    def schedule(running: list[tuple[str, int, int, int]], waiting: list[tuple[str, int, int, int]],
                 free_blocks: int, block_size: int, token_budget: int, max_num_seqs: int
                 ) -> list[tuple[str, int]]: ...

A sequence is ``(request_id, num_computed, num_tokens, num_blocks)``: ``num_computed`` tokens have
K/V in the cache, ``num_tokens`` is prompt + generated so far (``num_tokens - num_computed`` still
to
compute: a whole or partial prompt, or 1 for a decoding sequence), ``num_blocks`` the blocks its
table holds. Computing ``n`` more tokens needs ``ceil((num_computed + n) / block_size) -
num_blocks`` new blocks (never negative). The tick returns ``(request_id, n)`` pairs in order, under
this rule (no preemption):

1. running sequences first, in order: ``n = min(remaining, budget left)``; the tick stops once the
   budget is 0; a sequence whose new blocks exceed the free blocks left gets nothing, the next is
   tried;
2. then waiting sequences, first come first served, while budget is left and
   ``len(running) + admitted < max_num_seqs``: ``n = min(remaining, budget left)`` (a prompt is
   chunked to the budget); the first whose blocks do not fit stops admission.

The checker compares hand-written ticks with their expected plans, then drives the student's
``schedule`` tick by tick on seeded random workloads and checks every tick's plan against the rule's
invariants (budget, blocks, ``1 <= n <= remaining``, first come first served, running first, chunk
size, work conservation) and that every request finishes, or that the tick correctly schedules
nothing once the workload has stalled (no preemption). No reference implementation is involved. A
failed simulation's feedback on hidden cases names the tick, the rule broken, the call and what it
returned.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable

from servelab.exercises.hidden import hidden_rng, renamer
from servelab.exercises.result import Case, CaseFailure, CheckResult, run_cases
from servelab.kv import blocks_for
from servelab.prose import count

__all__ = [
    "SINGLE_TICKS",
    "blocks_needed",
    "check_scheduler_tick",
    "run_workload",
    "worked_example",
]

Seq = tuple[str, int, int, int]
Plan = list[tuple[str, int]]
Schedule = Callable[[list[Seq], list[Seq], int, int, int, int], Plan]

# (rule, (running, waiting, free_blocks, block_size, token_budget, max_num_seqs), expected plan)
SINGLE_TICKS = (
    (
        "running decodes are scheduled before a waiting prompt",
        ([("A", 5, 6, 2), ("B", 9, 10, 3)], [("C", 0, 20, 0)], 8, 4, 8, 4),
        [("A", 1), ("B", 1), ("C", 6)],
    ),
    (
        "a prompt is chunked to the budget left",
        ([("A", 12, 13, 4)], [("B", 0, 10, 0), ("C", 0, 4, 0)], 10, 4, 6, 4),
        [("A", 1), ("B", 5)],
    ),
    (
        "a partly prefilled running prompt takes the next chunk; an empty budget ends the tick",
        ([("A", 8, 20, 2), ("B", 3, 4, 1)], [("C", 0, 5, 0)], 4, 4, 8, 4),
        [("A", 8)],
    ),
    (
        "admission stops at max_num_seqs",
        ([("A", 4, 5, 2)], [("B", 0, 3, 0), ("C", 0, 3, 0), ("D", 0, 3, 0)], 10, 4, 32, 3),
        [("A", 1), ("B", 3), ("C", 3)],
    ),
    (
        "a running sequence short of blocks gets nothing; the next one still runs",
        ([("A", 8, 9, 2), ("B", 5, 6, 2)], [("C", 0, 4, 0)], 0, 4, 16, 4),
        [("B", 1)],
    ),
    (
        "admission stops at the first waiting prompt whose blocks do not fit (first come, "
        "first served)",
        ([], [("A", 0, 6, 0), ("B", 0, 12, 0), ("C", 0, 3, 0)], 3, 4, 32, 4),
        [("A", 6)],
    ),
    (
        "a decode token that crosses a block boundary needs one new block",
        ([("A", 8, 9, 2), ("B", 7, 8, 2)], [("C", 0, 2, 0)], 1, 4, 16, 4),
        [("A", 1), ("B", 1)],
    ),
    (
        "a budget of exactly the decodes admits nothing",
        ([("A", 5, 6, 2), ("B", 9, 10, 3)], [("C", 0, 4, 0)], 8, 4, 2, 4),
        [("A", 1), ("B", 1)],
    ),
)

# (rule, seed, requests, max prompt, max output, arrival spread in ticks, pool blocks, block size,
#  token budget, max_num_seqs, points)
SIMULATIONS = (
    (
        "every tick keeps the rule on a random workload, all arriving at once",
        1,
        10,
        24,
        6,
        1,
        24,
        4,
        16,
        4,
        2,
    ),
    (
        "every tick keeps the rule with staggered arrivals and a tight pool",
        2,
        12,
        16,
        10,
        12,
        14,
        4,
        12,
        5,
        2,
    ),
    (
        "every tick keeps the rule when long prompts are chunked by a small budget",
        3,
        8,
        40,
        4,
        6,
        30,
        8,
        10,
        3,
        2,
    ),
)


def blocks_needed(seq: Seq, n: int, block_size: int) -> int:
    """New blocks ``seq`` needs to compute ``n`` more tokens: ``ceil((computed + n) / bs) -
    blocks``, >= 0."""
    _, computed, _, blocks = seq
    return max(0, blocks_for(computed + n, block_size) - blocks)


def _by_id(args: tuple) -> dict[str, Seq]:
    """The running and waiting sequences of a tick's arguments, by request id."""
    return {s[0]: s for s in [*args[0], *args[1]]}


def _call_text(args: tuple) -> str:
    running, waiting, free, block_size, budget, max_seqs = args
    return (
        f"schedule(running={running}, waiting={waiting}, free_blocks={free}, "
        f"block_size={block_size}, "
        f"token_budget={budget}, max_num_seqs={max_seqs})"
    )


def _normalise(got: object) -> Plan:
    """The student's plan as a list of ``(str, int)`` pairs; CaseFailure when it is not one."""
    pairs = list(got) if isinstance(got, (list, tuple)) else None
    try:
        if pairs is None or any(not isinstance(p, (list, tuple)) or len(p) != 2 for p in pairs):
            raise TypeError
        return [(str(rid), operator.index(n)) for rid, n in pairs]
    except TypeError:
        raise CaseFailure(
            f"returned {got!r}, expected a list of (request_id, n) pairs with int n",
            f"returned {got!r}, not a list of (request_id, n) pairs with int n",
        ) from None


def _steps(args: tuple, plan: Plan) -> str:
    """The block arithmetic of each pair of ``plan``."""
    block_size, seqs = args[3], _by_id(args)
    parts = [
        f"{rid}: {count(n, 'token')}, ceil(({seqs[rid][1]} + {n}) / {block_size}) - "
        f"{seqs[rid][3]} = "
        f"{count(blocks_needed(seqs[rid], n, block_size), 'new block')}"
        for rid, n in plan
        if rid in seqs
    ]
    return "steps of the expected plan:\n" + "\n".join(
        f"  {part}" for part in parts or ["nothing is scheduled"]
    )


def _single(schedule: Schedule, args: tuple, expected: Plan) -> None:
    running, waiting, *rest = args
    got = _normalise(schedule(list(running), list(waiting), *rest))
    if got != expected:
        broken = _rule_error(args, got)
        why = f"\nthe rule it breaks: {broken}" if broken else ""
        raise CaseFailure(
            f"{_call_text(args)} returned {got}, expected {expected}{why}\n{_steps(args, expected)}"
        )


def _ids_error(args: tuple, plan: Plan) -> str | None:
    """Unknown or repeated ids, or an n outside 1..tokens still to compute."""
    seqs = _by_id(args)
    ids = [rid for rid, _ in plan]
    if any(rid not in seqs for rid in ids) or len(set(ids)) != len(ids):
        return f"every request_id must be a running or waiting one, at most once; got {ids}"
    for rid, n in plan:
        if not 1 <= n <= seqs[rid][2] - seqs[rid][1]:
            return (
                f"{rid} got n = {n}, allowed 1..{seqs[rid][2] - seqs[rid][1]} (its tokens "
                f"still to compute)"
            )
    return None


def _budget_error(args: tuple, plan: Plan) -> str | None:
    """More tokens than the budget or more new blocks than are free."""
    _, _, free, block_size, budget, _ = args
    seqs = _by_id(args)
    tokens = sum(n for _, n in plan)
    blocks = sum(blocks_needed(seqs[rid], n, block_size) for rid, n in plan)
    if tokens > budget:
        return f"the plan computes {count(tokens, 'token')}, the token budget is {budget}"
    if blocks > free:
        return f"the plan needs {count(blocks, 'new block')}, only {free} free"
    return None


def _turn_error(args: tuple, plan: Plan) -> str | None:
    """Walk the sequences in the rule's order: each one's n, or its absence, must follow from what
    is left."""
    running, waiting, free, block_size, budget, max_seqs = args
    given = dict(plan)
    for index, seq in enumerate([*running, *waiting]):
        is_waiting = index >= len(running)
        if budget == 0 or (is_waiting and index >= max_seqs):
            return None
        n = min(seq[2] - seq[1], budget)
        need = blocks_needed(seq, n, block_size)
        broken = _turn_of(seq[0], given.get(seq[0]), is_waiting, n, need, budget, free)
        if broken or (need > free and is_waiting):
            return broken
        if need <= free:
            budget, free = budget - n, free - need
    return None


def _turn_of(
    rid: str, got: int | None, is_waiting: bool, n: int, need: int, budget: int, free: int
) -> str | None:
    """What is wrong with ``rid`` getting ``got`` tokens (None: nothing) when the rule gives it
    ``n``."""
    at_turn = (
        f"at its turn: {count(n, 'token')} of the {budget} left, needing "
        f"{count(need, 'new block')}, "
        f"{free} free"
    )
    if need > free:
        return (
            None
            if got is None
            else f"{rid} got {count(got, 'token')}, but {at_turn}: it gets nothing this tick"
        )
    if got is None:
        kind = "work conservation: waiting" if is_waiting else "running sequences first: running"
        return f"{kind} {rid} fit ({at_turn}) but got nothing"
    if got != n:
        return (
            f"chunk size: {rid} got {count(got, 'token')}, expected min(remaining, budget "
            f"left) = {n} ({at_turn})"
        )
    return None


def _order_error(args: tuple, plan: Plan) -> str | None:
    """Pairs out of order (running as given, then waiting), admission not FCFS, or over
    max_num_seqs."""
    running, waiting, max_seqs = args[0], args[1], args[5]
    order = [s[0] for s in [*running, *waiting]]
    ids = [rid for rid, _ in plan]
    if [order.index(rid) for rid in ids] != sorted(order.index(rid) for rid in ids):
        return "pairs must come in order: running sequences as given, then waiting ones as queued"
    admitted = [rid for rid in ids if rid not in {s[0] for s in running}]
    if admitted != [s[0] for s in waiting[:len(admitted)]]:
        return f"first come, first served: admitted {admitted} is not the head of the waiting queue"
    if len(running) + len(admitted) > max_seqs:
        return f"{len(running)} running + {len(admitted)} admitted exceed max_num_seqs = {max_seqs}"
    return None


# Each invariant's check, and the rule's name as a student's feedback on a hidden case gives it.
_INVARIANTS = (
    (_ids_error, "every request_id at most once, with 1 <= n <= its tokens still to compute"),
    (_budget_error, "the plan fits the token budget and the free blocks"),
    (
        _turn_error,
        "running sequences first (one short of blocks is skipped), waiting ones while they fit, "
        "n = min(remaining, budget left)",
    ),
    (_order_error, "running as given, then waiting first come first served, at most max_num_seqs"),
)


def _broken_invariant(args: tuple, plan: Plan) -> tuple[str, str] | None:
    """``(rule name, what is wrong)`` for the first invariant ``plan`` breaks on ``args``, or
    None."""
    return next(
        ((name, broken) for check, name in _INVARIANTS if (broken := check(args, plan))), None
    )


def _rule_error(args: tuple, plan: Plan) -> str | None:
    """The first invariant of the rule that ``plan`` breaks on ``args``, or None."""
    found = _broken_invariant(args, plan)
    return found[1] if found else None


def _checked_plan(schedule: Schedule, args: tuple, where: str) -> Plan:
    """Call the student's tick on ``args``; CaseFailure with the tick's inputs if the plan breaks
    the rule."""
    running, waiting, *rest = args
    plan = _normalise(schedule(list(running), list(waiting), *rest))
    found = _broken_invariant(args, plan)
    if found:
        rule, broken = found
        raise CaseFailure(
            f"{where}: {broken}\n{_call_text(args)} returned {plan}",
            f"{where}: the plan breaks the rule: {rule}\n{_call_text(args)} returned {plan}",
        )
    return plan


def _workload(seed: int, num_requests: int, max_prompt: int, max_output: int,
              spread: int) -> list[tuple[str, int, int, int]]:
    """Seeded ``(request_id, arrival tick, prompt tokens, max output tokens)``, in arrival order."""
    rng = random.Random(seed)
    requests = [
        (f"r{i}", rng.randrange(spread), rng.randint(1, max_prompt), rng.randint(1, max_output))
        for i in range(num_requests)
    ]
    return sorted(requests, key=lambda r: r[1])


def _apply(plan: Plan, running: list[list], waiting: list[list], block_size: int) -> int:
    """Compute the plan's tokens; a sequence done with its tokens samples one more. Returns blocks
    taken."""
    seqs = {s[0]: s for s in [*running, *waiting]}
    running_ids = {s[0] for s in running}
    taken = 0
    for rid, n in plan:
        seq = seqs[rid]
        new = blocks_needed(tuple(seq), n, block_size)
        seq[1], seq[3], taken = seq[1] + n, seq[3] + new, taken + new
        if seq[1] == seq[2]:
            seq[2] += 1
    admitted = sum(rid not in running_ids for rid, _ in plan)
    running += waiting[:admitted]
    del waiting[:admitted]
    return taken


def run_workload(schedule: Schedule, requests: list[tuple[str, int, int, int]], pool_blocks: int,
                 block_size: int, token_budget: int, max_num_seqs: int, label: str = "",
                 max_ticks: int = 500) -> int:
    """Drive ``schedule`` from tick 0, checking every plan; return the ticks until every request
    finished, or until the rule can schedule nothing any more.

    A running sequence is ``[id, computed, tokens, blocks]``; it leaves, and frees its blocks, once
    it has sampled its maximum output (``tokens - prompt == max output``). The rule has no
    preemption, so a workload can stall: every running sequence short of blocks and the head of the
    queue too large (or no slot left). The rule then plans nothing, and nothing that arrives later
    changes that (it queues behind the head), so a correct ``[]`` with work present ends the
    workload there.
    """
    prompt = {rid: p for rid, _, p, _ in requests}
    limit = {rid: m for rid, _, _, m in requests}
    running: list[list] = []
    waiting: list[list] = []
    free, finished = pool_blocks, 0
    for t in range(max_ticks):
        waiting += [[rid, 0, p, 0] for rid, arrival, p, _ in requests if arrival == t]
        args = (
            [tuple(s) for s in running],
            [tuple(s) for s in waiting],
            free,
            block_size,
            token_budget,
            max_num_seqs,
        )
        plan = _checked_plan(schedule, args, f"{label}tick {t}")
        if not plan and (running or waiting):
            return t + 1  # stalled: the rule allows nothing now or later
        free -= _apply(plan, running, waiting, block_size)
        done = [s for s in running if s[2] - prompt[s[0]] == limit[s[0]]]
        free += sum(s[3] for s in done)
        finished += len(done)
        running[:] = [s for s in running if s not in done]
        if finished == len(requests):
            return t + 1
    raise CaseFailure(
        f"{label}not every request finished within {max_ticks} ticks: still running "
        f"{[tuple(s) for s in running]}, waiting {[tuple(s) for s in waiting]}, {free} free blocks"
    )


def _simulation(schedule: Schedule, spec: tuple) -> None:
    seed, num_requests, max_prompt, max_output, spread, pool, block_size, budget, max_seqs = spec
    requests = _workload(seed, num_requests, max_prompt, max_output, spread)
    try:
        run_workload(
            schedule, requests, pool, block_size, budget, max_seqs, f"workload seed {seed}, "
        )
    except CaseFailure as failure:
        workload = (
            f"the workload: {count(num_requests, 'request')} (id, arrival tick, prompt, "
            f"max output) "
            f"{requests}; pool {pool} blocks x {block_size} slots, token budget {budget}, "
            f"max_num_seqs {max_seqs}"
        )
        raise CaseFailure(
            f"{failure}\n{workload}", f"{failure.feedback or failure}\n{workload}"
        ) from None


def hidden_cases(seed: int) -> tuple[tuple, tuple]:
    """``(ticks, simulations)`` for ``seed``: the hand-written ticks with fresh request ids (their
    plans renamed alike), and the simulations on workloads drawn from new seeds."""
    rng = hidden_rng(seed, "scheduler_tick")
    ticks = []
    for rule, (running, waiting, *rest), expected in SINGLE_TICKS:
        names = renamer(rng, [s[0] for s in [*running, *waiting]])
        renamed = ([(names[s[0]], *s[1:]) for s in seqs] for seqs in (running, waiting))
        ticks.append((rule, (*renamed, *rest), [(names[r], n) for r, n in expected]))
    sims = tuple((rule, rng.randrange(2**31), *spec) for rule, _, *spec in SIMULATIONS)
    return tuple(ticks), sims


def check_scheduler_tick(
    schedule: Schedule, verbose: bool = True, seed: int | None = None
) -> CheckResult:
    """Run the hand-written ticks, then the seeded simulations with the rule checked at every tick
    (public cases, or the hidden ones of ``seed``)."""
    ticks, sims = (SINGLE_TICKS, SIMULATIONS) if seed is None else hidden_cases(seed)
    cases = [Case(rule, lambda a=args, e=exp: _single(schedule, a, e)) for rule, args, exp in ticks]
    cases += [Case(rule, lambda s=spec: _simulation(schedule, s), points)
              for rule, *spec, points in sims]
    return run_cases("scheduler tick", cases, verbose)


def worked_example() -> str:
    """The first hand-written tick and its expected plan, with the block arithmetic."""
    _, args, expected = SINGLE_TICKS[0]
    return f"{_call_text(args)}\n-> {expected}\n{_steps(args, expected)}"
