"""Every exercise checker passes the reference and fails a deliberately wrong implementation."""

from __future__ import annotations

import numpy as np
import pytest

import servelab.exercises
from servelab.exercises import (
    CheckResult,
    check_admission,
    check_batching_tick,
    check_block_allocator,
    check_goodput,
    check_kv_sizing,
    check_min_p,
    check_speculative,
    check_stop_buffer,
    check_top_p,
    worked_example,
)
from servelab.exercises._reference import (
    ReferenceAllocator,
    reference_accept,
    reference_admit,
    reference_kv_bytes_per_token,
    reference_max_requests,
    reference_residual,
    reference_tick,
)
from servelab.exercises.catalog import EXERCISES
from servelab.metrics import goodput, meets_slo
from servelab.sampling import min_p_filter, top_p_filter
from servelab.streaming import StopStringBuffer

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


@pytest.mark.parametrize("check", [check_top_p, check_min_p, check_goodput, check_batching_tick, check_admission])
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
