"""The fraction-of-floor benchmark's plumbing on the shipped model (figures are printed, never asserted)."""

import json
import random
import statistics

import pytest

from servelab.bench import cli, engine_bench
from servelab.bench.decode_floor import bench_floor, decode_floor_rows, format_floor, smollm2_random
from servelab.metrics.roofline.measured import Roofline
from servelab.model import load_checkpoint, load_tokenizer
from servelab.model.pretrained import SMOLLM2_135M_CONFIG


def test_bench_floor_reports_floors_fractions_and_the_baseline():
    model, tokenizer = load_checkpoint(None), load_tokenizer(None)
    hf = engine_bench.to_transformers(model)
    section = bench_floor(model, tokenizer, hf, random.Random(0), (1, 2), 8, 2)
    rows = section["engine"]
    assert [r["batch"] for r in rows] == [1, 2]
    for row in rows:
        floors = row["floor_s"]
        assert row["bound"] == max(floors, key=floors.get)
        assert row["fraction_of_floor"] == pytest.approx(max(floors.values()) / row["step_s"])
        assert row["ops"] > model.config.num_hidden_layers  # at least one operator per layer
    assert rows[1]["floor_s"]["memory"] > rows[0]["floor_s"]["memory"]  # a second sequence's KV is read too
    assert section["transformers_batch1"]["step_s"] > 0
    gemv = section["gemv_only_batch1"]  # every matrix once: the tied head once, the embedding not again
    assert gemv["bytes"] == 4 * (sum(p.numel() for p in model.parameters()) - sum(
        p.numel() for n, p in model.named_parameters() if "norm" in n))
    read = section["weight_read_batch1"]  # the floor timed beside the step
    assert read["fraction_of_floor"] == pytest.approx(read["step_s"] / rows[0]["step_s"])
    weight = model.lm_head.weight
    result = {"hardware": engine_bench.hardware(weight.device, weight.dtype), "floor": section}
    json.dumps(result)
    assert "of floor" in format_floor(result)


def test_smollm2_random_has_the_real_shape():
    model = smollm2_random()
    assert model.config.hidden_size == SMOLLM2_135M_CONFIG["hidden_size"] == 576
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # tied embeddings counted once


def test_threads_flag_only_for_the_named_model():
    with pytest.raises(SystemExit):
        cli.main(["--threads", "2", "--quick"])


def test_decode_floor_rows_place_each_step_on_the_roofline():
    model, tokenizer = load_checkpoint(None), load_tokenizer(None)
    roof = Roofline(read_bandwidth=1e10, peak_flops={"float32": 1e11}, op_overhead_s=1e-6, threads=1)
    ticks = iter(range(10**6))  # a fake clock: every timed step takes exactly 1 "second"
    rows = decode_floor_rows(model, tokenizer, roof, random.Random(0), (1, 4), 8, 3, clock=lambda: next(ticks))
    assert [(r["batch"], r["step_s"]) for r in rows] == [(1, 1), (4, 1)]
    assert rows[1]["per_token_s"] == pytest.approx(0.25)
    for row in rows:
        floors = row["floor_s"]
        assert row["fraction_of_floor"] == pytest.approx(max(floors.values()))  # floor over a 1-second step
        assert floors["overhead"] == pytest.approx(row["ops"] * 1e-6)
        assert row["achieved_flops"] == pytest.approx(floors["compute"] * 1e11)  # FLOPs done in 1 second
        assert row["achieved_bytes_per_s"] == pytest.approx(floors["memory"] * 1e10)
        assert row["intensity_flop_per_byte"] == pytest.approx(row["achieved_flops"] / row["achieved_bytes_per_s"])
    assert rows[1]["intensity_flop_per_byte"] > 3 * rows[0]["intensity_flop_per_byte"]  # the weights are shared


def test_the_pool_lesson_counts_the_asked_tokens_and_compares_both_pools():
    from servelab.bench.real_model import pool_lesson

    model, tokenizer = load_checkpoint(None), load_tokenizer(None)
    hf = engine_bench.to_transformers(model)
    prompts = engine_bench.random_prompts(random.Random(0), 4, 4, 8, model.config.vocab_size)
    lengths = [2, 3, 2, 9]
    run = pool_lesson(model, tokenizer, hf, prompts, lengths, repeats=3, small_pool_bytes=64 << 10)
    assert run["pool_blocks"]["engine_small_pool"] < run["pool_blocks"]["engine_default_pool"]
    for name, per_s in run["tokens_per_s"].items():  # every system is credited the 16 asked tokens
        assert per_s == pytest.approx(16 / statistics.median(run["seconds"][name]))
    assert set(run["vs_generate"]) == {"engine_default_pool", "engine_small_pool"}
    assert run["small_vs_default_pool"]["verdict"] in ("faster", "slower", "no measurable difference")
    json.dumps(run)
    with pytest.raises(ValueError, match="new_tokens"):
        pool_lesson(model, tokenizer, hf, prompts, lengths[:3], repeats=3)


def test_engine_bench_ratios_are_paired_medians_with_a_band_and_best_of_only_unpaired(monkeypatch):
    calls: list[str] = []
    ticks = {"slow": 4.0, "fast": 1.0}
    now = [0.0]

    def run(name: str):
        def fn() -> None:
            calls.append(name)
            now[0] += ticks[name] * (3.0 if len(calls) == 1 else 1.0)  # the first round disturbed
        return fn

    monkeypatch.setattr(engine_bench.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(engine_bench.time, "process_time", lambda: now[0])
    times = engine_bench.compare({"slow": run("slow"), "fast": run("fast")}, repeats=5)
    assert calls[:4] == ["slow", "fast", "fast", "slow"]  # the order rotates each round
    assert times["slow"]["wall_repeats"][0] == 12.0 and times["slow"]["wall_s"] == 4.0
    paired = engine_bench.ratio(times, "slow", "fast")
    assert paired["wall"] == 4.0 and paired["verdict"] == "faster"  # the median, not the disturbed round
    assert paired["band"][0] <= 4.0 <= paired["band"][1]
    times["once"] = {"wall_repeats": [8.0], "cpu_repeats": [8.0], "wall_s": 8.0, "cpu_s": 8.0}
    unpaired = engine_bench.ratio(times, "once", "fast")
    assert unpaired == {"wall": 8.0, "cpu": 8.0, "band": None, "verdict": None}
