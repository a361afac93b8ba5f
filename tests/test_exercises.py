"""Every exercise checker passes the reference and fails a deliberately wrong implementation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import servelab.exercises
from servelab.exercises import (
    CheckResult,
    check_admission,
    check_batching_tick,
    check_block_allocator,
    check_goodput,
    check_kv_sizing,
    check_min_p,
    check_paged_attention,
    check_scheduler_tick,
    check_speculative,
    check_stop_buffer,
    check_top_p,
    worked_example,
)
from servelab_instructor.solutions import reference_paged_attention
from servelab_instructor.reference import (
    ReferenceAllocator,
    reference_accept,
    reference_admit,
    reference_kv_bytes_per_token,
    reference_max_requests,
    reference_residual,
    reference_tick,
)
from servelab.exercises import attention, tick
from servelab.exercises.catalog import EXERCISES
from servelab.metrics.latency import goodput, meets_slo
from servelab.sampling import min_p_filter, top_p_filter
from servelab.sampling.stop_strings import StopStringBuffer

# ------------------------------------------------------------------------ deliberately wrong code


def top_p_drops_boundary(probs, p):
    """Keeps only tokens whose cumulative mass stays strictly below p: loses the crossing token."""
    probs = np.asarray(probs, dtype=float)
    order = np.argsort(-probs, kind="stable")
    keep = order[np.cumsum(probs[order]) < p]
    keep = keep if keep.size else order[:1]
    out = np.zeros_like(probs)
    out[keep] = probs[keep]
    return out / out.sum()


def min_p_fixed_threshold(probs, alpha):
    """Uses p_i >= alpha instead of p_i >= alpha * max p."""
    probs = np.asarray(probs, dtype=float)
    out = np.where(probs >= alpha, probs, 0.0)
    with np.errstate(invalid="ignore"):  # a flat distribution keeps nothing: 0 / 0
        return out / out.sum()


class LeakyStopBuffer:
    """Holds nothing back: only a complete stop string inside the text received so far is caught."""

    def __init__(self, stop_strings):
        self.stops, self.text, self.sent, self.done = list(stop_strings), "", 0, False

    def push(self, chunk):
        self.text += chunk
        hits = [self.text.find(s) for s in self.stops if s in self.text]
        end = min(hits) if hits else len(self.text)
        self.done = bool(hits)
        out, self.sent = self.text[self.sent:end], end
        return out

    def flush(self):
        return "" if self.done else self.text[self.sent:]


class ListAllocator:
    """A plain, correct student-style allocator: a free list and a refcount per block."""

    def __init__(self, num_blocks, block_size):
        self.block_size, self.free_list = block_size, list(range(num_blocks))
        self.refs, self.tables, self.sizes = [0] * num_blocks, {}, {}

    @property
    def num_free_blocks(self):
        return len(self.free_list)

    def _take(self, n):
        if n > len(self.free_list):
            raise MemoryError(f"need {n} blocks, {len(self.free_list)} free")
        taken, self.free_list = self.free_list[:n], self.free_list[n:]
        for b in taken:
            self.refs[b] = 1
        return taken

    def _blocks(self, tokens):
        return -(-tokens // self.block_size)

    def allocate(self, seq_id, num_tokens):
        self.tables[seq_id], self.sizes[seq_id] = self._take(self._blocks(num_tokens)), num_tokens
        return list(self.tables[seq_id])

    def append(self, seq_id, num_tokens):
        table, size = self.tables[seq_id], self.sizes[seq_id]
        cow = size % self.block_size != 0 and self.refs[table[-1]] > 1
        new = self._take(self._blocks(size + num_tokens) - len(table) + cow)
        if cow:
            self.refs[table[-1]] -= 1
            table[-1] = new.pop(0)
        table += new
        self.sizes[seq_id] = size + num_tokens

    def fork(self, parent_id, child_id):
        self.tables[child_id], self.sizes[child_id] = list(self.tables[parent_id]), self.sizes[parent_id]
        for b in self.tables[child_id]:
            self.refs[b] += 1

    def free(self, seq_id):
        returned = 0
        for b in self.tables.pop(seq_id, []):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free_list.append(b)
                returned += 1
        self.sizes.pop(seq_id, None)
        return returned

    def block_table(self, seq_id):
        return list(self.tables[seq_id])

    def refcount(self, block):
        return self.refs[block]


class EarlyFreeAllocator(ListAllocator):
    """Returns every block of a freed sequence to the pool, even blocks another sequence still shares."""

    def free(self, seq_id):
        table = self.tables.pop(seq_id, [])
        for b in table:
            self.refs[b] = 0
            if b not in self.free_list:
                self.free_list.append(b)
        return len(table)


def tick_without_refill(running, queue, capacity):
    """Static batching in disguise: admits only when every slot is empty."""
    if running:
        after = {n: left - 1 for n, left in running.items()}
        return {n: v for n, v in after.items() if v}, list(queue), [n for n, v in after.items() if not v]
    return reference_tick(running, queue, capacity)


def goodput_as_fraction(records, ttft_slo, tpot_slo, window):
    """Reports the share of requests meeting the SLO instead of a rate."""
    return sum(meets_slo(r, ttft_slo, tpot_slo) for r in records) / len(records)


def paged_attention_ignores_table(q, k_cache, v_cache, block_table, positions):
    """Reads physical blocks 0, 1, 2, ... as if the table were the identity."""
    return reference_paged_attention(q, k_cache, v_cache, list(range(len(block_table))), positions)


def paged_attention_no_causal_mask(q, k_cache, v_cache, block_table, positions):
    """Lets every query of the chunk see the whole context, later positions of the chunk included."""
    return reference_paged_attention(q, k_cache, v_cache, block_table, positions[-1].expand(len(positions)))


def paged_attention_head_modulo(q, k_cache, v_cache, block_table, positions):
    """Grouped-query attention with query head h on KV head h % n_kv_heads (``repeat``, not ``repeat_interleave``)."""
    n_kv = k_cache.shape[2]
    heads = [reference_paged_attention(q[:, h:h + 1], k_cache[:, :, h % n_kv:h % n_kv + 1],
                                    v_cache[:, :, h % n_kv:h % n_kv + 1], block_table, positions)
             for h in range(q.shape[1])]
    return torch.cat(heads, dim=1)


def _ceil_div(a, b):
    return -(-a // b)


def _take(seq, budget, free, block_size):
    """(n, new blocks) for one sequence under the tick's rule."""
    _, computed, tokens, blocks = seq
    n = min(tokens - computed, budget)
    return n, max(0, _ceil_div(computed + n, block_size) - blocks)


def schedule_fcfs(running, waiting, free_blocks, block_size, token_budget, max_num_seqs):
    """A plain, correct student-style tick: running first (skip on blocks), then FCFS admission (stop on blocks)."""
    plan, budget, free = [], token_budget, free_blocks
    for seq in running:
        if budget == 0:
            return plan
        n, need = _take(seq, budget, free, block_size)
        if need <= free:
            plan.append((seq[0], n))
            budget, free = budget - n, free - need
    for admitted, seq in enumerate(waiting):
        if budget == 0 or len(running) + admitted >= max_num_seqs:
            break
        n, need = _take(seq, budget, free, block_size)
        if need > free:
            break
        plan.append((seq[0], n))
        budget, free = budget - n, free - need
    return plan


def schedule_prefill_first(running, waiting, free_blocks, block_size, token_budget, max_num_seqs):
    """Admits waiting prompts before the running decodes get their tokens."""
    admitted = schedule_fcfs([], waiting, free_blocks, block_size, token_budget, max_num_seqs - len(running))
    seqs = {s[0]: s for s in waiting}
    budget = token_budget - sum(n for _, n in admitted)
    free = free_blocks - sum(_take(seqs[rid], n, free_blocks, block_size)[1] for rid, n in admitted)
    return admitted + schedule_fcfs(running, [], free, block_size, budget, max_num_seqs)


def schedule_ignores_blocks(running, waiting, free_blocks, block_size, token_budget, max_num_seqs):
    """Never looks at the free blocks."""
    return schedule_fcfs(running, waiting, 10**9, block_size, token_budget, max_num_seqs)


def schedule_never_chunks(running, waiting, free_blocks, block_size, token_budget, max_num_seqs):
    """Admits a prompt only if it fits the budget whole."""
    plan = schedule_fcfs(running, [], free_blocks, block_size, token_budget, max_num_seqs)
    seqs = {s[0]: s for s in running}
    budget = token_budget - sum(n for _, n in plan)
    free = free_blocks - sum(_take(seqs[rid], n, free_blocks, block_size)[1] for rid, n in plan)
    for admitted, seq in enumerate(waiting):
        n, need = _take(seq, budget, free, block_size)
        if n < seq[2] - seq[1] or need > free or len(running) + admitted >= max_num_seqs:
            break
        plan.append((seq[0], n))
        budget, free = budget - n, free - need
    return plan


def not_implemented(*args):
    raise NotImplementedError("write your code here")


# ------------------------------------------------------------------------ both directions

def goodput_ignores_tpot(records, ttft_slo, tpot_slo, window):
    """Counts requests that finished in the window and met TTFT; never looks at TPOT."""
    start, end = window
    good = [r for r in records if start <= r.finish <= end and r.ttft <= ttft_slo]
    return len(good) / (end - start)


def accept_without_cap(p, q, token):
    """p/q without the min(1, .): a probability above 1 for tokens the target likes more."""
    return p[token] / q[token]


def residual_from_target(p, q):
    """Resamples a rejected draft from p itself: the classic bias toward tokens the draft proposed."""
    return np.asarray(p, dtype=float)


def kv_bytes_query_heads(n_layer, n_head, n_kv_head, d_head, bytes_per_elem):
    """Sizes the cache with the query heads: GQA models come out several times too large."""
    return 2 * n_layer * n_head * d_head * bytes_per_elem


def max_requests_prompt_only(pool_bytes, bytes_per_token, block_size, prompt_tokens, max_output_tokens):
    """Reserves the prompt only: admits requests whose decode will run out of blocks."""
    pool_blocks = pool_bytes // (block_size * bytes_per_token)
    return pool_blocks // -(-prompt_tokens // block_size)


def admit_skipping(queue, pool_blocks, held_blocks, block_size, free_slots):
    """Lets later, smaller requests overtake one that does not fit: starves large requests."""
    left, admitted, rejected = pool_blocks - held_blocks, [], []
    for name, prompt, output in queue:
        need = -(-(prompt + output) // block_size)
        if need > pool_blocks:
            rejected.append(name)
        elif need <= left and len(admitted) < free_slots:
            admitted.append(name)
            left -= need
    return admitted, rejected


CHECKS = [
    ("top-p", check_top_p, (top_p_filter,), (top_p_drops_boundary,),
     "the token whose cumulative mass crosses p is kept"),
    ("min-p", check_min_p, (min_p_filter,), (min_p_fixed_threshold,),
     "the threshold is alpha times the top probability"),
    ("stop buffer", check_stop_buffer, (StopStringBuffer,), (LeakyStopBuffer,),
     "a stop string split over three chunks is never sent"),
    ("allocator (reference)", check_block_allocator, (ReferenceAllocator,), (EarlyFreeAllocator,),
     "a shared block returns only with its last holder"),
    ("allocator (plain)", check_block_allocator, (ListAllocator,), (EarlyFreeAllocator,),
     "a shared block returns only with its last holder"),
    ("tick", check_batching_tick, (reference_tick,), (tick_without_refill,),
     "a free slot is refilled before the tick runs"),
    ("goodput (fraction)", check_goodput, (goodput,), (goodput_as_fraction,),
     "goodput is a rate over the window (requests/s), not a fraction"),
    ("goodput (no TPOT)", check_goodput, (goodput,), (goodput_ignores_tpot,),
     "a request that meets TTFT but misses the TPOT SLO does not count"),
    ("speculative (no cap)", check_speculative, (reference_accept, reference_residual),
     (accept_without_cap, reference_residual), "a draft token is kept with probability min(1, p(x)/q(x))"),
    ("speculative (residual = p)", check_speculative, (reference_accept, reference_residual),
     (reference_accept, residual_from_target), "a rejected draft is replaced from norm(max(0, p - q)), not from p"),
    ("kv sizing (query heads)", check_kv_sizing, (reference_kv_bytes_per_token, reference_max_requests),
     (kv_bytes_query_heads, reference_max_requests), "grouped-query attention: only the KV heads are cached"),
    ("kv capacity (prompt only)", check_kv_sizing, (reference_kv_bytes_per_token, reference_max_requests),
     (reference_kv_bytes_per_token, max_requests_prompt_only),
     "every request reserves its prompt plus its whole output allowance"),
    ("admission (skipping)", check_admission, (reference_admit,), (admit_skipping,),
     "first come, first served: a request that must wait blocks the ones behind it"),
    ("paged attention (ignores the table)", check_paged_attention, (reference_paged_attention,),
     (paged_attention_ignores_table,), "the block table maps logical blocks to physical ones, in any order"),
    ("paged attention (no causal mask)", check_paged_attention, (reference_paged_attention,),
     (paged_attention_no_causal_mask,), "a whole prompt from position 0 is causal"),
    ("paged attention (h % n_kv)", check_paged_attention, (reference_paged_attention,),
     (paged_attention_head_modulo,), "grouped-query attention: query head h reads KV head h // (n_heads // n_kv_heads)"),
    ("scheduler tick (prefill first)", check_scheduler_tick, (schedule_fcfs,), (schedule_prefill_first,),
     "running decodes are scheduled before a waiting prompt"),
    ("scheduler tick (ignores blocks)", check_scheduler_tick, (schedule_fcfs,), (schedule_ignores_blocks,),
     "a running sequence short of blocks gets nothing; the next one still runs"),
    ("scheduler tick (never chunks)", check_scheduler_tick, (schedule_fcfs,), (schedule_never_chunks,),
     "a prompt is chunked to the budget left"),
]


@pytest.mark.parametrize("name, check, right, wrong, failing_case", CHECKS, ids=[c[0] for c in CHECKS])
def test_checker_passes_reference(name, check, right, wrong, failing_case):
    result = check(*right, verbose=False)
    assert isinstance(result, CheckResult)
    assert result.passed, result.report()
    assert len(result.cases) >= 3 and not result.failures


@pytest.mark.parametrize("name, check, right, wrong, failing_case", CHECKS, ids=[c[0] for c in CHECKS])
def test_checker_fails_wrong_implementation(name, check, right, wrong, failing_case, capsys):
    result = check(*wrong)
    printed = capsys.readouterr().out
    assert not result.passed and not result.not_implemented
    assert failing_case in [c.name for c in result.failures]
    assert "FAIL" in printed and f"rule: {failing_case}" in printed
    assert 0 <= result.points < result.max_points


def test_leak_and_fraction_are_explained():
    failures = check_stop_buffer(LeakyStopBuffer, verbose=False).failures
    leak = failures[0].detail
    assert "leaked" in leak and "'#'" in leak and "pushes before it: none" in leak
    tag = next(c.detail for c in failures if c.name == "stop string split inside a tag")
    assert "pushes before it: push('Hello') -> 'Hello'; push(' wor') -> ' wor'" in tag
    fraction = check_goodput(goodput_as_fraction, verbose=False).failures[0].detail
    assert "attainment fraction" in fraction


def test_goodput_without_tpot_fails_only_the_tpot_rule():
    failures = check_goodput(goodput_ignores_tpot, verbose=False).failures
    assert [c.name for c in failures] == ["a request that meets TTFT but misses the TPOT SLO does not count"]
    assert "TPOT 0.50 s" in failures[0].detail


def test_allocator_failure_lists_the_steps_before_it():
    failure = next(c for c in check_block_allocator(EarlyFreeAllocator, verbose=False).failures
                   if c.name == "a shared block returns only with its last holder")
    assert "step 3 free('A')" in failure.detail
    before = failure.detail.split("steps before it:", 1)[1]
    assert "step 1 allocate('A', 6) -> 2" in before and "step 2 fork('A', 'B')" in before


def test_speculative_exactness_is_enumerated():
    detail = check_speculative(reference_accept, residual_from_target, verbose=False).failures[0].detail
    assert "distributed as" in detail and "residual" in detail
    from servelab.exercises.speculative import output_distribution_of
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.3, 0.5])
    assert np.allclose(output_distribution_of(reference_accept, reference_residual, p, q), p)
    assert not np.allclose(output_distribution_of(reference_accept, residual_from_target, p, q), p)


def test_capacity_failure_shows_the_arithmetic():
    detail = check_kv_sizing(reference_kv_bytes_per_token, max_requests_prompt_only, verbose=False).failures[0].detail
    assert "whole blocks" in detail and "ceil((100 + 156) / 16) = 16 blocks" in detail


def test_admission_cases_each_isolate_a_rule():
    def ignores_held(queue, pool_blocks, held_blocks, block_size, free_slots):
        return reference_admit(queue, pool_blocks, 0, block_size, free_slots)

    assert [c.name for c in check_admission(ignores_held, verbose=False).failures] == [
        "blocks held by running requests are not free"]


def test_references_are_not_exported():
    public = set(servelab.exercises.__all__) | set(dir(servelab.exercises))
    assert not {"ReferenceAllocator", "reference_tick", "reference_admit"} & public


def test_points_add_up():
    result = check_block_allocator(ReferenceAllocator, verbose=False)
    assert result.points == result.max_points == sum(c.max_points for c in result.cases) > len(result.cases)
    half = check_goodput(goodput_ignores_tpot, verbose=False)
    assert half.points == half.max_points - 2


@pytest.mark.parametrize("stem", sorted(EXERCISES))
def test_every_exercise_has_a_worked_example_and_a_notebook(stem):
    from pathlib import Path

    text = worked_example(stem)
    assert "->" in text and len(text.splitlines()) >= 1
    assert (Path(__file__).resolve().parents[1] / "notebooks" / "exercises" / f"{stem}.ipynb").is_file()


@pytest.mark.parametrize("check", [check_top_p, check_min_p, check_goodput, check_batching_tick, check_admission,
                                   check_paged_attention, check_scheduler_tick])
def test_stub_reports_not_implemented(check, capsys):
    result = check(not_implemented)
    assert result.not_implemented and not result.passed
    assert result.points == 0 and result.max_points >= len(result.cases) >= 3
    assert "not implemented yet" in capsys.readouterr().out


@pytest.mark.parametrize("check", [check_speculative, check_kv_sizing])
def test_two_function_stub_reports_not_implemented(check):
    assert check(not_implemented, not_implemented, verbose=False).not_implemented


@pytest.mark.parametrize("check", [check_stop_buffer, check_block_allocator])
def test_class_stub_reports_not_implemented(check):
    class Stub:
        def __init__(self, *args):
            raise NotImplementedError

    assert check(Stub, verbose=False).not_implemented


def test_other_exceptions_become_failed_cases():
    def broken(probs, p):
        raise ValueError("oops")

    result = check_top_p(broken, verbose=False)
    assert not result.passed and not result.not_implemented
    assert all("ValueError: oops" in c.detail for c in result.failures)


# ------------------------------------------------------------------------ paged attention


def test_paged_attention_wrong_code_fails_only_its_rule():
    gqa = "grouped-query attention: query head h reads KV head h // (n_heads // n_kv_heads)"
    assert [c.name for c in check_paged_attention(paged_attention_head_modulo, verbose=False).failures] == [gqa]
    no_mask = {c.name for c in check_paged_attention(paged_attention_no_causal_mask, verbose=False).failures}
    assert "one decode token attends to every position up to its own" not in no_mask
    assert "a chunk in the middle sees the cached prefix and is causal inside" in no_mask


def test_paged_attention_failure_names_position_and_error():
    failure = next(c for c in check_paged_attention(paged_attention_no_causal_mask, verbose=False).failures
                   if c.name == "a whole prompt from position 0 is causal")
    assert "block_table=[1, 4], positions=[0, 1, 2, 3, 4, 5, 6]" in failure.detail
    assert "the query at position 0 (row t=0) is off by up to" in failure.detail
    assert "max abs error" in failure.detail and "expected attention over positions 0..0" in failure.detail


def test_paged_attention_shape_and_type_are_checked():
    shape = check_paged_attention(lambda q, k, v, table, pos: q[:, :1], verbose=False).failures[0].detail
    assert "returned shape [1, 1, 8], expected [T, n_heads, head_dim] = [1, 2, 8]" in shape
    kind = check_paged_attention(lambda q, k, v, table, pos: q.tolist(), verbose=False).failures[0].detail
    assert "returned a list, expected a torch.Tensor" in kind


def test_pool_holds_the_context_along_the_table_and_garbage_elsewhere():
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(5, 2, 3, generator=gen)
    pool = attention.scatter_into_pool(k, [3, 1], 4, 4, gen)
    p = torch.arange(5)
    assert torch.equal(pool[torch.tensor([3, 1])[p // 4], p % 4], k)
    unused = torch.cat([pool[0], pool[2], pool[1, 1:]])
    assert torch.isfinite(pool).all() and unused.abs().mean() > 100 * k.abs().mean()


def test_oracle_is_gqa_attention_with_a_causal_mask():
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 6, 4, generator=gen), torch.randn(7, 2, 4, generator=gen), torch.randn(7, 2, 4, generator=gen)
    positions = torch.arange(4, 7)
    mask = torch.arange(7)[None, :] <= positions[:, None]
    sdpa = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                          attn_mask=mask, enable_gqa=True).transpose(0, 1)
    assert torch.allclose(attention.expected_attention(q, k, v, positions), sdpa, atol=1e-6)
    last = attention.expected_attention(q[-1:], k, v, positions[-1:])
    assert torch.allclose(last, attention.expected_attention(q, k, v, positions)[-1:], atol=1e-6)


# ------------------------------------------------------------------------ scheduler tick


def test_tick_simulation_failure_gives_the_tick_inputs():
    failure = next(c for c in check_scheduler_tick(schedule_prefill_first, verbose=False).failures
                   if c.name.startswith("every tick keeps the rule on a random workload"))
    first, call, workload = failure.detail.splitlines()
    assert first.startswith("workload seed 1, tick ") and "running sequences first: running r0 fit" in first
    assert call.startswith("schedule(running=[('r0', ") and "free_blocks=" in call and "returned [('r1'," in call
    assert workload.startswith("the workload: 10 requests")
    blocks = next(c for c in check_scheduler_tick(schedule_ignores_blocks, verbose=False).failures
                  if c.name.startswith("every tick keeps the rule with staggered arrivals"))
    assert "new blocks, only 0 free" in blocks.detail.splitlines()[0]


def test_tick_hand_case_failure_names_the_broken_rule():
    failure = next(c for c in check_scheduler_tick(schedule_never_chunks, verbose=False).failures
                   if c.name == "a prompt is chunked to the budget left")
    assert "returned [('A', 1)], expected [('A', 1), ('B', 5)]" in failure.detail
    assert "the rule it breaks: work conservation: waiting B fit" in failure.detail
    assert "B: 5 tokens, ceil((0 + 5) / 4) - 0 = 2 new blocks" in failure.detail


def test_expected_plans_follow_the_rule():
    for rule, args, expected in tick.SINGLE_TICKS:
        running, waiting, *rest = args
        assert schedule_fcfs(list(running), list(waiting), *rest) == expected, rule
        assert tick._rule_error(args, expected) is None, rule


BAD_PLANS = [
    ([("A", 1), ("B", 1), ("C", 7)], "the plan computes 9 tokens, the token budget is 8"),
    ([("A", 1), ("Z", 1)], "every request_id must be a running or waiting one"),
    ([("A", 1), ("A", 1)], "at most once"),
    ([("A", 2)], "A got n = 2, allowed 1..1"),
    ([("A", 1), ("B", 1), ("C", 5)], "chunk size: C got 5 tokens, expected min(remaining, budget left) = 6"),
    ([("B", 1), ("A", 1), ("C", 6)], "pairs must come in order"),
    ([("A", 1), ("B", 1)], "work conservation: waiting C fit"),
    ([("B", 1), ("C", 7)], "running sequences first: running A fit"),
]


@pytest.mark.parametrize("plan, message", BAD_PLANS)
def test_every_invariant_is_checked(plan, message):
    args = tick.SINGLE_TICKS[0][1]
    assert message in tick._rule_error(args, plan)


def test_fcfs_and_slot_invariants():
    args = ([], [("A", 0, 6, 0), ("B", 0, 12, 0), ("C", 0, 3, 0)], 3, 4, 32, 4)
    assert "first come, first served: admitted ['A', 'C']" in tick._rule_error(args, [("A", 6), ("C", 3)])
    full = ([("A", 4, 5, 2)], [("B", 0, 3, 0), ("C", 0, 3, 0)], 10, 4, 32, 2)
    assert "1 running + 2 admitted exceed max_num_seqs = 2" in tick._rule_error(full, [("A", 1), ("B", 3), ("C", 3)])
    short = ([("A", 8, 20, 2)], [], 1, 4, 8, 4)
    assert ("A got 4 tokens, but at its turn: 8 tokens of the 8 left, needing 2 new blocks, 1 free: it gets nothing"
            in tick._rule_error(short, [("A", 4)]))
    one = ([("A", 4, 5, 1)], [], 0, 4, 8, 4)  # one decode token that needs one new block, none free
    assert tick._rule_error(one, [("A", 1)]) == "the plan needs 1 new block, only 0 free"


def test_simulations_exercise_chunks_and_block_pressure():
    chunked, skipped = 0, 0

    def spy(running, waiting, free_blocks, block_size, token_budget, max_num_seqs):
        nonlocal chunked, skipped
        plan = schedule_fcfs(running, waiting, free_blocks, block_size, token_budget, max_num_seqs)
        seqs, given = {s[0]: s for s in [*running, *waiting]}, dict(plan)
        chunked += any(n < seqs[rid][2] - seqs[rid][1] for rid, n in plan)
        skipped += any(s[0] not in given for s in running) and sum(given.values()) < token_budget
        return plan

    for rule, seed, count, max_prompt, max_output, spread, pool, bs, budget, max_seqs, _ in tick.SIMULATIONS:
        requests = tick._workload(seed, count, max_prompt, max_output, spread)
        assert 0 < tick.run_workload(spy, requests, pool, bs, budget, max_seqs) < 100, rule
    assert chunked >= 5 and skipped >= 1


def test_tick_plan_must_be_pairs():
    detail = check_scheduler_tick(lambda *args: {"A": 1}, verbose=False).failures[0].detail
    assert "expected a list of (request_id, n) pairs" in detail


# ------------------------------------------------------------------------ hidden cases (grading seed)

@pytest.mark.parametrize("seed", [1, 20261202])
@pytest.mark.parametrize("name, check, right, wrong, failing_case", CHECKS, ids=[c[0] for c in CHECKS])
def test_hidden_cases_keep_every_rule(name, check, right, wrong, failing_case, seed):
    public = check(*right, verbose=False)
    hidden = check(*right, verbose=False, seed=seed)
    assert hidden.passed, hidden.report()
    assert [(c.name, c.max_points) for c in hidden.cases] == [(c.name, c.max_points) for c in public.cases]
    assert failing_case in [c.name for c in check(*wrong, verbose=False, seed=seed).failures]


def test_hidden_cases_differ_by_seed_and_repeat_for_one_seed():
    from servelab.exercises import admission, kv, metrics, sampling, sizing, streaming

    for make in (lambda s: sampling.hidden_cases(sampling.TOP_P_CASES, s, "top_p"), streaming.hidden_cases,
                 kv.hidden_scenarios, metrics.hidden_cases, sizing.hidden_cases, admission.hidden_cases):
        assert make(7) == make(7)
        assert make(7) != make(8)


def test_top_p_tie_case_catches_a_reversed_tie_break():
    def larger_id_wins(probs, p):
        order = np.lexsort((-np.arange(len(probs)), -np.asarray(probs)))  # ties: the larger id first
        keep = order[np.cumsum(np.asarray(probs)[order]) - np.asarray(probs)[order] < p]
        out = np.zeros(len(probs))
        out[keep] = np.asarray(probs)[keep]
        return out / out.sum()

    failed = {c.name for c in check_top_p(larger_id_wins, verbose=False).failures}
    assert "ties broken by the smaller id" in failed
