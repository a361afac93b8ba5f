import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import servelab.checks as checks
from servelab.scheduling.batching import Request
from servelab.checks import EngineState, engine_tick, run_all
from servelab.kv import BlockAllocator
from servelab.lifecycle.state_machine import RequestState, SlotPool
from servelab.metrics.roofline import ModelShape, decode_cost


def test_run_all_passes_every_check():
    results = run_all()
    assert [r.check_id for r in results] == [f"D{i:02d}" for i in range(1, 11)]
    failed = [r.line() for r in results if not r.passed]
    assert not failed, failed


def test_lines_carry_computed_figures():
    lines = {r.check_id: r.line() for r in run_all()}
    assert "A=1,B=4,C=5 (util=0.60)" in lines["D04"]
    assert "A=1,C=2,B=4 (util=0.75)" in lines["D04"]
    assert "3->1" in lines["D05"] and "3->4" in lines["D05"]
    assert "384 B" in lines["D07"] and "768 B" in lines["D07"]
    assert "201.3" in lines["D09"]
    shape = ModelShape(70_000_000_000, 80, 8192, 8, 128, 2)
    decode_2048 = decode_cost(shape, 2048, 1).intensity
    assert f"decode batch 1 at context 2,048: {decode_2048:.2f} FLOP/byte" in lines["D09"]
    assert decode_cost(shape, 4096, 1).intensity > decode_2048  # the cause the line states
    assert "512 B -> 256 B" in lines["D10"]


def test_a_failing_check_reports_fail_and_others_still_run(monkeypatch):
    def broken() -> str:
        """[D99] deliberately broken."""
        raise ValueError("boom")

    monkeypatch.setattr(checks, "CHECKS", (("D99", broken),) + checks.CHECKS[:1])
    results = run_all()
    assert not results[0].passed and "boom" in results[0].line() and results[0].line().endswith("FAIL")
    assert results[1].passed


def test_main_exits_nonzero_on_failure(monkeypatch, capsys):
    def broken() -> str:
        """[D99] deliberately broken."""
        raise checks.CheckFailure("expected 1, got 2")

    monkeypatch.setattr(checks, "CHECKS", (("D99", broken),))
    assert checks.main() == 1
    assert "1 check failed: D99" in capsys.readouterr().out


def test_engine_tick_seed_example_and_following_ticks():
    waiting = [Request("A", 0, 1), Request("B", 0, 4), Request("C", 0, 1)]
    state = EngineState(waiting, SlotPool(2), BlockAllocator(num_blocks=8, block_size=4))
    rng = np.random.default_rng(0)
    first = engine_tick(state, m_token=64, rng=rng)
    assert first.admitted == ("A", "B") and first.finished == ("A",)
    assert (first.kv_bytes_before_reclaim, first.kv_bytes_after_reclaim) == (512, 256)
    assert state.lifecycles["B"].state is RequestState.DECODE
    second = engine_tick(state, m_token=64, rng=rng)
    assert second.admitted == ("C",) and second.finished == ("C",)
    assert set(state.owed) == {"B"} and state.owed["B"] == 2
    assert [r.request_id for r in state.ledger] == ["A", "C"]
    assert state.slots.in_use == 1
    for _ in range(2):
        engine_tick(state, m_token=64, rng=rng)
    assert state.allocator.num_used_blocks == 0 and state.slots.in_use == 0
    assert [r.usage.generated_tokens for r in state.ledger] == [1, 1, 4]
    state.allocator.inspect().check_invariants()


def test_engine_tick_admission_respects_kv_headroom():
    state = EngineState([Request("A", 0, 3), Request("B", 0, 3)], SlotPool(2),
                        BlockAllocator(num_blocks=1, block_size=4))
    report = engine_tick(state, m_token=64, rng=np.random.default_rng(0))
    assert report.admitted == ("A",) and [r.name for r in state.waiting] == ["B"]


def test_engine_tick_rejects_bad_arguments():
    state = EngineState([], SlotPool(1), BlockAllocator(num_blocks=1, block_size=4))
    with pytest.raises(ValueError, match="m_token"):
        engine_tick(state, m_token=0, rng=np.random.default_rng(0))
    with pytest.raises(TypeError, match="state"):
        engine_tick("state", m_token=64, rng=np.random.default_rng(0))


def test_module_entry_point_exits_zero_with_ten_lines():
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(root / "lib"), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "servelab.checks"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if re.match(r"\[D\d\d\] ", line)]
    assert len(lines) == 10 and all(line.endswith("PASS") for line in lines)
