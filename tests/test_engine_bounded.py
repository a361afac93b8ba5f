"""Flat memory over many requests: after a few thousand short requests every store that grows with
requests or steps is within its bound, and the ledger's totals are exact over all of them."""

from __future__ import annotations

import gc
from collections import Counter

import pytest

from servelab.engine import LLMEngine
from servelab.lifecycle.ledger import Ledger, TerminalRecord, Usage
from servelab.lifecycle.state_machine import RequestState
from servelab.sampling import SamplingParams

from test_engine import config, make_prompts, model, tokenizer  # noqa: F401 (fixtures)

SHORT = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


def _record(request_id: str, state: RequestState = RequestState.FINISHED, prompt: int = 3) -> TerminalRecord:
    return TerminalRecord(request_id, state, "stop", 0.0, Usage(prompt, 2, 2), RequestState.DECODE, 1, 0, 1, 0)


def test_ledger_window_totals_and_duplicate_rule():
    ledger = Ledger(max_records=3)
    for i in range(5):
        ledger.append(_record(f"r{i}", RequestState.CANCELLED if i % 2 else RequestState.FINISHED, prompt=i))
    assert [r.request_id for r in ledger.records] == ["r2", "r3", "r4"] and len(ledger) == 3
    totals = ledger.totals()
    assert totals.requests == 5 and totals.prompt_tokens == 0 + 1 + 2 + 3 + 4 and totals.generated_tokens == 10
    assert totals.by_state == {RequestState.FINISHED: 3, RequestState.CANCELLED: 2}
    assert totals.blocks_freed == 5 and totals.slots_released == 5
    with pytest.raises(ValueError, match="'r2' already has a terminal record"):  # in the window: refused
        ledger.append(_record("r2"))
    assert not ledger.has("r0")  # left the window: forgotten, so it may be appended again
    ledger.append(_record("r0"))
    assert ledger.totals().requests == 6 and [r.request_id for r in ledger.records] == ["r3", "r4", "r0"]
    with pytest.raises(KeyError, match="r1"):
        ledger.get("r1")


@pytest.mark.parametrize("bad", [-1, 2.5, None, True])
def test_ledger_and_config_refuse_a_bad_window(bad):
    with pytest.raises((TypeError, ValueError), match="max_records"):
        Ledger(max_records=bad)
    with pytest.raises((TypeError, ValueError), match="ledger_size"):
        config(ledger_size=bad)


def test_ledger_size_zero_keeps_no_record_but_counts_every_one():
    ledger = Ledger(max_records=0)
    ledger.append(_record("a"))
    ledger.append(_record("a"))  # nothing kept, so nothing to check against
    assert len(ledger) == 0 and ledger.totals().requests == 2


def test_thousands_of_short_requests_leave_every_store_within_its_bound(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_model_len=128, max_num_seqs=16,
                                                trace_steps=50, ledger_size=100))
    prompts = make_prompts(7, 40)
    prompt_tokens, emitted, reasons, live = 0, 0, Counter(), {}  # live: ordered set of request ids

    def step() -> None:
        nonlocal emitted
        for output in engine.step().outputs:
            emitted += len(output.delta_token_ids)
            if output.finished:
                reasons[output.finish_reason] += 1
                live.pop(output.request_id, None)

    for i in range(2000):
        prompt = prompts[i % len(prompts)]
        live[engine.add_request(prompt, SHORT, request_id=f"soak-{i}")] = None
        prompt_tokens += len(prompt)
        if i % 7 == 3:  # some end by cancel, before or after their first token
            oldest = next(iter(live))
            del live[oldest]
            assert engine.cancel(oldest)
        if len(live) >= 24:
            step()
    while engine.has_unfinished():
        step()
    assert len(engine.ledger) == 100 and len(engine.trace) == 50 and engine.num_steps > 50
    assert not engine._requests and not engine._pending  # live-request stores emptied on every terminal path
    assert not engine.allocator._seqs and not engine.allocator._reserved and engine.slots.in_use == 0
    assert engine.runner.host_swap is None or (engine.runner.host_swap.in_use == 0 and not engine.runner.host_swap._data)
    ended = engine.stats().ended
    assert reasons["cancelled"] == 2000 // 7 + 1 and reasons["length"] + reasons["cancelled"] == 2000
    assert ended.requests == 2000
    assert ended.by_state == {RequestState.FINISHED: reasons["length"], RequestState.CANCELLED: reasons["cancelled"]}
    assert ended.prompt_tokens == prompt_tokens
    assert ended.generated_tokens == ended.emitted_tokens == emitted


def test_an_ended_request_is_freed_by_refcounting_not_left_to_the_cyclic_gc(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(trace_steps=0, ledger_size=10))
    prompts = make_prompts(3, 8)
    engine.generate(prompts, SHORT)  # warm-up: whatever the first run builds once
    gc.collect()
    gc.disable()
    try:
        engine.generate(prompts * 20, [SHORT, SamplingParams(temperature=0.8, max_tokens=3, n=2, seed=1)] * 80)
        assert gc.collect() == 0  # no request, sequence or detokenizer left behind in a reference cycle
    finally:
        gc.enable()
