"""The per-step profile's plumbing on the shipped model: its parts add up to the step, each measured part
is a real cost, the floors come from the roofline (figures are printed by the benchmark, never asserted)."""

import json

import pytest
import torch

from servelab.bench import step_profile
from servelab.bench.real_model import native_bf16
from servelab.model import load_checkpoint, load_tokenizer
from servelab.metrics.roofline.measured import Roofline

ROOF = Roofline(read_bandwidth=20e9, peak_flops={"float32": 100e9, "bfloat16": 200e9}, op_overhead_s=2e-6,
                threads=1)


def test_the_parts_add_up_to_the_step_and_the_measured_ones_cost_time():
    torch.set_num_threads(1)
    model, tokenizer = load_checkpoint(None), load_tokenizer(None)
    rows = step_profile.profile_rows(model, tokenizer, ROOF, (1, 4), context=24, steps=3)
    assert [r["batch"] for r in rows] == [1, 4]
    for row in rows:
        parts = row["parts_s"]
        assert list(parts) == list(step_profile.PARTS)
        assert sum(parts.values()) == pytest.approx(row["step_s"])  # the two remainders close the sum
        assert all(parts[p] > 0 for p in ("weight_gemms", "attention", "inputs", "sampling"))
        assert row["context_tokens"] >= 25  # the prompt and the tokens decoded before the timed steps
        weights = 4 * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        assert row["floor_s"]["weight_read"] >= weights / ROOF.read_bandwidth  # every weight, plus the KV
    assert rows[1]["floor_s"]["gemm_compute"] == pytest.approx(4 * rows[0]["floor_s"]["gemm_compute"])
    json.dumps(rows)
    assert "weight-read floor" in step_profile.format_profile(rows)


def test_native_bf16_reads_the_cpu_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert native_bf16(info)
    info.write_text("flags\t\t: fpu avx2 avx512f\n")
    assert not native_bf16(info)
    assert not native_bf16(tmp_path / "missing")


def test_the_targets_read_the_median_ratios_and_the_batch1_floor():
    from servelab.bench.real_model import TARGETS, targets_met

    def section(vs_generate, vs_batch):
        return {"engine_vs_generate": {"ratio": vs_generate}, "engine_vs_generate_batch": {"ratio": vs_batch}}

    throughput = {"8": section(1.6, 2.5), "32": section(1.4, 2.0)}
    floor = {"weight_read_batch1": {"fraction_of_floor": 0.9}}  # the read beside the step
    assert targets_met(throughput, floor) == {
        "engine_vs_generate_8": True, "engine_vs_generate_32": False, "engine_vs_generate_batch_8": True,
        "engine_vs_generate_batch_32": True, "batch1_fraction_of_weight_read_floor": True}
    assert TARGETS["batch1_fraction_of_weight_read_floor"] == 0.85
