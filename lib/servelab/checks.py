"""The course's sanity checks [D01]-[D10]: ``python -m servelab.checks``.

Each check calls the library's public functions, compares what they compute with the worked numbers
of the book, and reports one line whose figures were computed on this run, never typed in. A check
that fails prints FAIL and the reason; the others still run. The command exits 0 only when all pass.

[D10] is the engine tick of the scheduler chapter rebuilt from library pieces only (FCFS admission
under a ``SlotPool`` and KV headroom, ``BlockAllocator`` block tables, ``RequestLifecycle`` states,
top-k + ``sample`` on a placeholder logit vector, finish detection, ``lifecycle.reclaim``), so
"finished means released" is checked, not just drawn.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from servelab.scheduling.batching import (
    Request,
    chunked_prefill_scenario,
    simulate_batching,
    simulate_iterations,
    utilization,
)
from servelab.kv import (
    BlockAllocator,
    block_alloc_slots,
    kv_bytes_per_token,
    kv_heads_per_tp_rank,
    physical_blocks_no_sharing,
    physical_blocks_with_sharing,
)
from servelab.lifecycle.ledger import Usage
from servelab.lifecycle.state_machine import (
    Ledger,
    RequestLifecycle,
    RequestState,
    SlotPool,
    reclaim,
)
from servelab.prose import count
from servelab.metrics.roofline import ModelShape, decode_cost, prefill_cost, ridge_point
from servelab.sampling import (
    apply_frequency_presence,
    apply_hard_mask,
    apply_repetition_penalty,
    greedy,
    min_p_filter,
    min_p_support_from_logits,
    sample,
    softmax,
    support,
    temperature_probs,
    top_k_filter,
    top_p_filter,
    typical_filter,
)
from servelab.sampling.stop_strings import StopStringBuffer


class CheckFailure(AssertionError):
    """A check's computed value disagrees with the expected one."""


def _expect(condition: bool, reason: str) -> None:
    if not condition:
        raise CheckFailure(reason)


def _raises(
    error: type[Exception] | tuple[type[Exception], ...], call: Callable[[], object]
) -> bool:
    try:
        call()
    except error:
        return True
    return False


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check: its id (``"D04"``), whether it passed, and the printed detail."""

    check_id: str
    passed: bool
    detail: str

    def line(self) -> str:
        return f"[{self.check_id}] {self.detail}  {'PASS' if self.passed else 'FAIL'}"


# --- D01-D03: sampling and streaming --------------------------------------------------------------


def check_sampling_operators() -> str:
    """[D01] every sampling operator's support set and edge case."""
    logits = [4.0, 3.0, 2.0, 1.0]
    probs = softmax(logits)
    _expect(greedy([1.0, 3.0, 3.0, 0.0]) == 1, "greedy must take the lowest id on a tie")
    _expect(_raises(ValueError, lambda: temperature_probs(logits, 0.0)), "T=0 must be rejected")
    cold = temperature_probs(logits, 0.01)
    tied = temperature_probs([4.0, 4.0, 2.0, 1.0], 0.01)
    _expect(cold[0] > 1 - 1e-9, f"unique max at T->0 should be one-hot, got {cold[0]:.6f}")
    _expect(
        np.allclose(tied, [0.5, 0.5, 0, 0], atol=1e-9), f"tied max at T->0 should split, got {tied}"
    )
    _expect(support(top_k_filter(probs, 2)) == [0, 1], "top-k=2 must keep exactly the two best")
    top_p = support(top_p_filter([0.4, 0.3, 0.2, 0.1], 0.65))
    _expect(top_p == [0, 1], f"top-p 0.65 must keep the boundary token, got {top_p}")
    min_p_sizes = [len(support(min_p_filter(probs, a))) for a in (0.9, 0.5, 0.2, 0.05)]
    _expect(
        min_p_sizes == sorted(min_p_sizes) and min_p_sizes[0] >= 1, "min-p must grow as alpha falls"
    )
    by_temp = [len(min_p_support_from_logits([4, 3, 2, 1, 0], t, 0.3)) for t in (0.2, 0.5, 1, 2, 5)]
    _expect(by_temp == sorted(by_temp) and by_temp[0] < by_temp[-1], f"min-p vs T: {by_temp}")
    typical = support(typical_filter([0.02, 0.35, 0.33, 0.30], 0.63))
    _expect(typical == [2, 3], f"typical must drop the most probable token, got {typical}")
    shifted = softmax([z + 7.5 for z in logits])
    for name, f in (
        ("top-k", lambda p: top_k_filter(p, 3)),
        ("top-p", lambda p: top_p_filter(p, 0.8)),
        ("min-p", lambda p: min_p_filter(p, 0.3)),
    ):
        _expect(
            support(f(probs)) == support(f(shifted)), f"{name} support changed under a logit shift"
        )
    penalised = apply_repetition_penalty([2.0, -2.0, 1.0], [0, 1], 1.2)
    _expect(np.allclose(penalised, [2 / 1.2, -2.4, 1.0]), f"repetition penalty wrong: {penalised}")
    freq = apply_frequency_presence([1.0, 1.0, 1.0], [0, 1, 3], 0.5, 0.25)
    _expect(np.allclose(freq, [1.0, 0.25, -0.75]), f"frequency/presence penalty wrong: {freq}")
    masked = support(softmax(apply_hard_mask(logits, [1, 3])))
    _expect(masked == [1, 3], f"mask must leave only the allowed ids, got {masked}")
    first, second = np.random.default_rng(7), np.random.default_rng(7)
    _expect([sample(probs, first) for _ in range(20)] == [sample(probs, second) for _ in range(20)],
            "the same seed must give the same draws")
    _expect(
        sample([0, 0, 1.0, 0], np.random.default_rng(0)) == 2, "a one-token support must be drawn"
    )
    rng = np.random.default_rng(0)
    target = np.array([0.5, 0.3, 0.2])
    counts = np.bincount([sample(target, rng) for _ in range(20_000)], minlength=3) / 20_000
    _expect(
        np.abs(counts - target).max() < 0.02, f"empirical frequencies {counts} far from {target}"
    )
    return (f"sampling: greedy tie->id 1, T=0 rejected, T->0 one-hot p={cold[0]:.4f} / tied split "
            f"{tied[0]:.2f}+{tied[1]:.2f}, top-p(0.65)={top_p}, min-p sizes vs T={by_temp}, "
            f"typical(0.63)={typical}, shift-invariant, penalties, mask={masked}, "
            f"seeded draws repeat, empirical max error {np.abs(counts - target).max():.3f}")


def check_filter_order() -> str:
    """[D02] top-k then top-p differs from top-p then top-k on the same distribution."""
    probs = [0.45, 0.30, 0.15, 0.10]
    k_then_p = support(top_p_filter(top_k_filter(probs, 3), 0.8))
    p_then_k = support(top_k_filter(top_p_filter(probs, 0.8), 3))
    _expect(k_then_p == [0, 1] and p_then_k == [0, 1, 2], f"got {k_then_p} and {p_then_k}")
    return (
        f"filter order matters: top_k(3)->top_p(0.8) keeps {k_then_p}, top_p->top_k keeps "
        f"{p_then_k}"
    )


def check_stop_strings() -> str:
    """[D03] a stop string split across three chunks is caught, and nothing of it leaks."""
    buffer = StopStringBuffer(["STOP"])
    pieces = [buffer.push(chunk) for chunk in ("abcST", "O", "P and more")]
    emitted = "".join(pieces)
    _expect(buffer.finished and emitted == "abc", f"expected 'abc' then stop, got {emitted!r}")
    _expect(all("S" not in piece for piece in pieces), f"a stop-string prefix leaked: {pieces}")
    free = StopStringBuffer(["STOP"])
    streamed = "".join(free.push(chunk) for chunk in ("abST", "Ox", "yS"))
    recovered = streamed + free.flush()
    _expect(recovered == "abSTOxyS", f"no-match text must come back whole, got {recovered!r}")
    return (f"stop strings: 'STOP' over 3 chunks caught, emitted {emitted!r}; "
            f"no-match flush recovers {recovered!r}")


# --- D04-D05: batching ----------------------------------------------------------------------------


def _illegal_batching_inputs() -> list[Callable[[], object]]:
    ok = [Request("A", 0, 1)]
    return [
        lambda: simulate_batching([], 2, "static"),
        lambda: simulate_batching(["A"], 2, "static"),
        lambda: simulate_batching([Request("A", 0, 1), Request("A", 1, 2)], 2, "static"),
        lambda: simulate_batching(ok, 0, "static"),
        lambda: simulate_batching(ok, 2, "round-robin"),
        lambda: Request("A", -1, 1),
        lambda: Request("A", 0, 0),
    ]


def check_batching() -> str:
    """[D04] static vs continuous on the A, B, C workload (1, 4 and 1 tokens, 2 slots), the
    equal-length tie, arrivals, bad inputs."""
    reqs = [Request("A", 0, 1), Request("B", 0, 4), Request("C", 0, 1)]
    static, _ = simulate_batching(reqs, 2, "static")
    cont, _ = simulate_batching(reqs, 2, "continuous")
    _expect(static == {"A": 1, "B": 4, "C": 5}, f"static completion {static}")
    _expect(cont == {"A": 1, "C": 2, "B": 4}, f"continuous completion {cont}")
    u_static, u_cont = utilization(static, reqs, 2)[0], utilization(cont, reqs, 2)[0]
    _expect(
        (round(u_static, 2), round(u_cont, 2)) == (0.60, 0.75), f"utilisation {u_static}, {u_cont}"
    )
    equal = [Request("X", 0, 3), Request("Y", 0, 3)]
    spans = {p: max(simulate_batching(equal, 2, p)[0].values()) for p in ("static", "continuous")}
    _expect(spans["static"] == spans["continuous"], f"equal-length makespans differ: {spans}")
    delayed = [Request("A", 0, 2), Request("B", 3, 2), Request("C", 4, 1)]
    done, trace = simulate_batching(delayed, 2, "continuous")
    arrival = {r.name: r.arrival for r in delayed}
    _expect(all(arrival[n] <= rec.tick < done[n] for rec in trace for n in rec.active),
            "a delayed request ran outside [arrival, completion)")
    rejected = sum(_raises((TypeError, ValueError), bad) for bad in _illegal_batching_inputs())
    _expect(rejected == 7, f"only {rejected} of 7 illegal inputs rejected")

    def fmt(completion: dict[str, int]) -> str:
        return ",".join(f"{n}={t}" for n, t in sorted(completion.items(), key=lambda kv: kv[1]))

    return (
        f"batching: static {fmt(static)} (util={u_static:.2f}); continuous {fmt(cont)} "
        f"(util={u_cont:.2f}); equal lengths: both makespan={spans['static']}; delayed arrivals "
        f"run inside [arrival, completion); {rejected}/7 illegal inputs rejected"
    )


def check_chunked_prefill() -> str:
    """[D05] chunking shortens the running stream's worst gap and delays the long prompt's TTFT."""
    s = chunked_prefill_scenario()
    whole = simulate_iterations(s.requests, s.tokens_per_tick, None)
    chunked = simulate_iterations(s.requests, s.tokens_per_tick, s.chunked_budget)
    gaps = (whole.max_decode_gap(), chunked.max_decode_gap())
    ttfts = (whole.ttft(s.long_prompt), chunked.ttft(s.long_prompt))
    _expect(gaps == (3, 1) and ttfts == (3, 4), f"gap {gaps}, TTFT {ttfts}")
    return (f"chunked prefill: max decode gap {gaps[0]}->{gaps[1]} ticks, long-prompt TTFT "
            f"{ttfts[0]}->{ttfts[1]} ticks (better ITL, worse TTFT)")


# --- D06-D08: KV accounting -----------------------------------------------------------------------


def check_kv_bytes_per_token() -> str:
    """[D06] the KV payload of one token for the toy layout."""
    layers, kv_heads, head_dim, elem_bytes = 2, 2, 4, 2
    m_token = kv_bytes_per_token(layers, kv_heads, head_dim, elem_bytes)
    _expect(m_token == 64, f"bytes/token {m_token}")
    return (
        f"KV bytes/token (layers={layers}, kv_heads={kv_heads}, head_dim={head_dim}, "
        f"{elem_bytes} B) = {m_token} B = 2 (K and V) x {layers} x {kv_heads} x {head_dim} "
        f"x {elem_bytes}"
    )


def check_block_fragmentation() -> str:
    """[D07] whole blocks are allocated, so the last block of each sequence is partly empty."""
    m_token = kv_bytes_per_token(2, 2, 4, 2)
    logical, allocated = block_alloc_slots([1, 5], 4)
    _expect((logical, allocated) == (6, 12), f"slots {logical}/{allocated}")
    return (
        f"block allocation lengths [1,5], block 4: logical {logical} slots/{logical * m_token} B, "
        f"allocated {allocated} slots/{allocated * m_token} B (internal fragmentation)"
    )


def check_sharing_and_allocator() -> str:
    """[D08] prefix sharing by exact tokens, the TP guard, and a fork/copy-on-write round trip."""
    no_share = physical_blocks_no_sharing([6, 7], 4)
    shared = physical_blocks_with_sharing([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8, 9]], 4)
    _expect((no_share, shared) == (4, 3), f"sharing {no_share}->{shared}")
    short = [[1, 2, 3, 5, 6], [1, 2, 3, 7, 8]]
    _expect(physical_blocks_with_sharing(short, 4) == physical_blocks_no_sharing([5, 5], 4),
            "a sub-block overlap must share nothing")
    three = [list(range(8)) + [100 + i] for i in range(3)]
    saved = physical_blocks_no_sharing([9] * 3, 4) - physical_blocks_with_sharing(three, 4)
    _expect(saved == (3 - 1) * 2, f"3-way sharing of 2 blocks saved {saved}, expected 4")
    _expect(
        _raises(ValueError, lambda: kv_heads_per_tp_rank(8, 3)) and kv_heads_per_tp_rank(8, 4) == 2,
        "TP guard must reject 8 KV heads over 3 ranks",
    )
    pool = BlockAllocator(num_blocks=8, block_size=4)
    pool.allocate_prompt("parent", [1, 2, 3, 4, 5, 6])
    pool.fork("parent", "child")
    tail = pool.block_table("parent")[-1]
    _expect(pool.refcount(tail) == 2, "fork must share the parent's blocks")
    copies = pool.append_tokens("child", [7])
    _expect(len(copies) == 1 and copies[0].src == tail and pool.refcount(tail) == 1,
            "writing the shared tail must copy-on-write")
    pool.free("child")
    pool.free("parent")
    pool.inspect().check_invariants()
    _expect(pool.num_used_blocks == 0, "freeing both sequences must return every block")
    return (
        f"prefix sharing (exact token match) {no_share}->{shared} blocks, sub-block "
        f"overlap shares 0, "
        f"3-way sharing saves {saved} = (n-1)*B_shared, TP guard rejects 8 heads / TP 3, "
        f"fork + copy-on-write + free leaves 0 blocks in use"
    )


# --- D09: roofline --------------------------------------------------------------------------------


def check_roofline() -> str:
    """[D09] the A100-class ridge point, with prefill and decode placed on either side of it."""
    ridge = ridge_point(312e12, 1.55e12)
    _expect(round(ridge, 1) == 201.3, f"ridge point {ridge}")
    shape = ModelShape(70_000_000_000, 80, 8192, 8, 128, 2)
    context = 2048
    pre = prefill_cost(shape, context).intensity
    dec = decode_cost(shape, context, 1).intensity
    _expect(
        pre > ridge > dec, f"prefill {pre:.0f} and decode {dec:.2f} FLOP/B vs ridge {ridge:.1f}"
    )
    # attention over the cache does 4 x layers x hidden FLOPs per cached token's KV bytes
    per_cached = 4 * shape.n_layers * shape.hidden_size / shape.kv_bytes_per_token
    return (
        f"roofline ridge I* = {ridge:.1f} FLOP/byte (upper-bound reference only); 70B "
        f"bf16: prefill "
        f"of {context:,} tokens {pre:.0f}, decode batch 1 at context {context:,}: "
        f"{dec:.2f} FLOP/byte "
        f"(rises with the context: each cached token adds {per_cached:.0f} FLOP per KV byte)"
    )


# --- D10: one engine tick -------------------------------------------------------------------------


@dataclass
class EngineState:
    """What persists between ticks.

    ``waiting`` is the FCFS queue of validated requests; ``slots`` the batch slots (its capacity is
    max_num_seqs); ``allocator`` holds every running request's KV blocks; ``ledger`` collects one
    terminal record per finished request. ``lifecycles``, ``owed`` (tokens still to produce) and
    ``tokens`` (prompt + generated ids) cover the running requests; ``now`` counts ticks.
    """

    waiting: list[Request]
    slots: SlotPool
    allocator: BlockAllocator
    ledger: Ledger = field(default_factory=Ledger)
    lifecycles: dict[str, RequestLifecycle] = field(default_factory=dict)
    owed: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    now: int = 0


@dataclass(frozen=True)
class TickReport:
    """One tick's results; KV bytes are the allocator's used blocks x block size x bytes per
    token."""

    admitted: tuple[str, ...]
    next_tokens: dict[str, int]
    finished: tuple[str, ...]
    kv_bytes_before_reclaim: int
    kv_bytes_after_reclaim: int


PLACEHOLDER_LOGITS = (4.0, 3.0, 2.0, 1.0)
"""Stand-in for a forward pass: every running request gets these logits (the model is not the
point)."""


def _admit(state: EngineState, request: Request, prompt: tuple[int, ...]) -> None:
    lifecycle = RequestLifecycle(request.name, at=state.now)
    for stage in (RequestState.VALIDATED, RequestState.QUEUED, RequestState.PREFILL):
        lifecycle.transition(stage, at=state.now)
    state.slots.acquire(request.name)
    state.allocator.allocate_prompt(request.name, prompt)
    state.lifecycles[request.name] = lifecycle
    state.owed[request.name] = request.ticks_needed
    state.tokens[request.name] = list(prompt)


def engine_tick(
    state: EngineState, m_token: int, rng: np.random.Generator, prompt: tuple[int, ...] = (0,)
) -> TickReport:
    """Run one scheduler iteration over ``state`` (time ``state.now`` -> ``state.now + 1``).

    1. admission: pop the waiting queue FCFS while a batch slot is free and the allocator has
       headroom for ``prompt``'s blocks; the request's lifecycle moves to PREFILL and its prompt
       gets a block table (tokenization and the ingress gate happened before the queue);
    2. forward (placeholder): every running request receives ``PLACEHOLDER_LOGITS``;
    3. sample and commit: ``sample(top_k_filter(softmax(logits), 2), rng)``; the token's KV slot is
       appended to the request's block table;
    4. finish: a request that has produced its ``ticks_needed`` tokens is FINISHED;
    5. reclaim: ``lifecycle.reclaim`` frees its blocks and batch slot and writes its terminal
    record. ``m_token`` is KV bytes per token (int >= 1); ``rng`` a seeded
    ``numpy.random.Generator``.
    """
    if not isinstance(state, EngineState):
        raise TypeError("state must be an EngineState")
    if isinstance(m_token, bool) or not isinstance(m_token, int) or m_token < 1:
        raise ValueError(f"m_token must be an int >= 1, got {m_token!r}")
    pool = state.allocator
    admitted = []
    while state.waiting and state.slots.available and (
        pool.num_blocks_to_allocate(prompt) <= pool.num_available_blocks
    ):
        request = state.waiting.pop(0)
        _admit(state, request, prompt)
        admitted.append(request.name)

    end = state.now + 1
    next_tokens = {}
    for name in state.owed:
        token = sample(top_k_filter(softmax(PLACEHOLDER_LOGITS), 2), rng)
        pool.append_tokens(name, [token])
        state.tokens[name].append(token)
        state.owed[name] -= 1
        next_tokens[name] = token
    finished = tuple(name for name, left in state.owed.items() if left == 0)

    def kv_bytes() -> int:
        return pool.num_used_blocks * pool.block_size * m_token

    before = kv_bytes()
    for name in finished:
        generated = len(state.tokens[name]) - len(prompt)
        reclaim(state.lifecycles.pop(name), RequestState.FINISHED, ledger=state.ledger, at=end,
                reason="max_new_tokens", allocator=pool, seq_ids=[name], slots=state.slots,
                usage=Usage(len(prompt), generated, generated))
        del state.owed[name], state.tokens[name]
    for lifecycle in state.lifecycles.values():
        if lifecycle.state is RequestState.PREFILL:
            lifecycle.transition(RequestState.DECODE, at=end)
    state.now = end
    return TickReport(tuple(admitted), next_tokens, finished, before, kv_bytes())


def check_engine_tick() -> str:
    """[D10] A/B/C waiting, capacity 2, block size 4, 64 B/token: A finishes and its KV is
    reclaimed."""
    waiting = [Request("A", 0, 1), Request("B", 0, 4), Request("C", 0, 1)]
    state = EngineState(waiting, SlotPool(2), BlockAllocator(num_blocks=8, block_size=4))
    report = engine_tick(
        state, m_token=kv_bytes_per_token(2, 2, 4, 2), rng=np.random.default_rng(0)
    )
    _expect(report.admitted == ("A", "B") and report.finished == ("A",),
            f"admitted {report.admitted}, finished {report.finished}")
    _expect(set(report.next_tokens.values()) <= {0, 1}, f"top-k=2 sampled {report.next_tokens}")
    _expect((report.kv_bytes_before_reclaim, report.kv_bytes_after_reclaim) == (512, 256),
            f"KV bytes {report.kv_bytes_before_reclaim}->{report.kv_bytes_after_reclaim}")
    state.allocator.inspect().check_invariants()
    record = state.ledger.records[0]
    _expect(len(state.ledger) == 1 and record.request_id == "A" and record.slots_released == 1,
            "reclaim must write one record for A and release its slot")
    return (
        f"engine tick: admitted {','.join(report.admitted)}, sampled {report.next_tokens}, "
        f"finished "
        f"{','.join(report.finished)}, KV {report.kv_bytes_before_reclaim} B -> "
        f"{report.kv_bytes_after_reclaim} B after reclaim"
    )


# --- runner ---------------------------------------------------------------------------------------

CHECKS: tuple[tuple[str, Callable[[], str]], ...] = (
    ("D01", check_sampling_operators),
    ("D02", check_filter_order),
    ("D03", check_stop_strings),
    ("D04", check_batching),
    ("D05", check_chunked_prefill),
    ("D06", check_kv_bytes_per_token),
    ("D07", check_block_fragmentation),
    ("D08", check_sharing_and_allocator),
    ("D09", check_roofline),
    ("D10", check_engine_tick),
)


def run_all() -> list[CheckResult]:
    """Run every check; an exception inside one becomes that check's FAIL, not a crash."""
    results = []
    for check_id, check in CHECKS:
        try:
            results.append(CheckResult(check_id, True, check()))
        except Exception as error:  # noqa: BLE001 - a failing check must not stop the others
            results.append(CheckResult(check_id, False, f"{check.__doc__.split(']')[1].strip()} -- "
                                                        f"{type(error).__name__}: {error}"))
    return results


def main() -> int:
    results = run_all()
    for result in results:
        print(result.line())
    failed = [r.check_id for r in results if not r.passed]
    print(
        "all sanity checks passed"
        if not failed
        else f"{count(len(failed), 'check')} failed: {', '.join(failed)}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
