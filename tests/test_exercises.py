"""Every exercise checker passes the reference and fails a deliberately wrong implementation."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.exercises import (
    CheckResult,
    ReferenceAllocator,
    check_batching_tick,
    check_block_allocator,
    check_goodput,
    check_min_p,
    check_stop_buffer,
    check_top_p,
    reference_tick,
)
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

CHECKS = [
    ("top-p", check_top_p, top_p_filter, top_p_drops_boundary, "boundary token is kept"),
    ("min-p", check_min_p, min_p_filter, min_p_fixed_threshold, "threshold scales with the top probability"),
    ("stop buffer", check_stop_buffer, StopStringBuffer, LeakyStopBuffer, "stop string split over three chunks"),
    ("allocator (reference)", check_block_allocator, ReferenceAllocator, EarlyFreeAllocator,
     "a shared block returns only with its last holder"),
    ("allocator (plain)", check_block_allocator, ListAllocator, EarlyFreeAllocator,
     "a shared block returns only with its last holder"),
    ("tick", check_batching_tick, reference_tick, tick_without_refill, "a free slot is refilled before the tick runs"),
    ("goodput", check_goodput, goodput, goodput_as_fraction, "a rate over a 10 s window, not a fraction"),
]


@pytest.mark.parametrize("name, check, right, wrong, failing_case", CHECKS, ids=[c[0] for c in CHECKS])
def test_checker_passes_reference(name, check, right, wrong, failing_case):
    result = check(right, verbose=False)
    assert isinstance(result, CheckResult)
    assert result.passed, result.report()
    assert len(result.cases) >= 3 and not result.failures


@pytest.mark.parametrize("name, check, right, wrong, failing_case", CHECKS, ids=[c[0] for c in CHECKS])
def test_checker_fails_wrong_implementation(name, check, right, wrong, failing_case, capsys):
    result = check(wrong)
    printed = capsys.readouterr().out
    assert not result.passed and not result.not_implemented
    assert failing_case in [c.name for c in result.failures]
    assert "FAIL" in printed and failing_case in printed


def test_leak_and_fraction_are_explained():
    leak = check_stop_buffer(LeakyStopBuffer, verbose=False).failures[0].detail
    assert "leaked" in leak and "'#'" in leak
    fraction = check_goodput(goodput_as_fraction, verbose=False).failures[0].detail
    assert "attainment fraction" in fraction


@pytest.mark.parametrize("check", [check_top_p, check_min_p, check_goodput, check_batching_tick])
def test_stub_reports_not_implemented(check, capsys):
    result = check(not_implemented)
    assert result.not_implemented and not result.passed
    assert "not implemented yet" in capsys.readouterr().out


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
