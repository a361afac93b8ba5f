"""The roofline probes and floors: units, the max-of-three rule and counting operators (no timing asserts)."""

import pytest
import torch

from servelab.model.llama import LlamaConfig, LlamaForCausalLM
from servelab.metrics.roofline import ModelShape, decode_cost
from servelab.metrics.roofline.measured import (Roofline, StepFloor, count_ops, decode_floor, measure_matmul_flops,
                                        measure_op_overhead, measure_read_bandwidth, measure_roofline,
                                        median_seconds, model_shape)

ROOF = Roofline(read_bandwidth=20e9, peak_flops={"float32": 1e12, "bfloat16": 2e12}, op_overhead_s=2e-6, threads=2)


def test_floor_takes_the_largest_and_names_it():
    memory = ROOF.floor(bytes_moved=2e9, flops=1e9, ops=10)
    assert memory.memory_s == pytest.approx(0.1) and memory.bound == "memory" and memory.seconds == memory.memory_s
    compute = ROOF.floor(bytes_moved=1e3, flops=5e12, ops=10)
    assert compute.bound == "compute" and compute.seconds == pytest.approx(5.0)
    overhead = ROOF.floor(bytes_moved=1e3, flops=1e3, ops=1000)
    assert overhead.bound == "overhead" and overhead.seconds == pytest.approx(2e-3)


def test_bf16_peak_halves_the_compute_floor_and_moves_the_ridge():
    assert ROOF.floor(0, 1e12, 0, "bfloat16").compute_s == pytest.approx(0.5)
    assert ROOF.ridge_point("float32") == pytest.approx(50.0)
    assert ROOF.ridge_point("bfloat16") == pytest.approx(100.0)
    assert ROOF.attainable(10.0) == pytest.approx(2e11)  # below the ridge: bandwidth x intensity
    assert ROOF.attainable(1e4) == pytest.approx(1e12)  # above: the compute roof


def test_fraction_of_floor():
    floor = StepFloor(0.01, 0.001, 0.002)
    assert floor.fraction_of(0.04) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="measured_s"):
        floor.fraction_of(0.0)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="dtype"):
        ROOF.floor(1, 1, 1, "float16")
    with pytest.raises(ValueError, match="ops"):
        ROOF.floor(1, 1, -1)
    with pytest.raises(ValueError, match="budget_s"):
        median_seconds(lambda: None, budget_s=0)
    with pytest.raises(ValueError, match="dtype"):
        measure_matmul_flops(torch.int8, size=32, budget_s=0.01)


def test_probes_return_positive_rates():
    assert measure_read_bandwidth(1 << 20, budget_s=0.02) > 0
    assert measure_matmul_flops(torch.float32, size=64, budget_s=0.02) > 0
    assert 0 < measure_op_overhead(budget_s=0.02, batch=10) < 1.0
    roof = measure_roofline(budget_s=0.02, bandwidth_bytes=1 << 20, matmul_size=64)
    assert set(roof.to_dict()["ridge_point_flop_per_byte"]) == {"float32", "bfloat16"}
    assert roof.threads == torch.get_num_threads()


def test_median_seconds_respects_repeat_bounds():
    calls = []
    median_seconds(lambda: calls.append(1), budget_s=10.0, min_repeats=2, max_repeats=4)
    assert len(calls) == 5  # one warm-up, then max_repeats


def test_median_seconds_reads_the_clock_it_is_given():
    ticks = iter(range(0, 1000, 2))  # every call of fn takes exactly 2 "seconds" on this clock
    assert median_seconds(lambda: None, budget_s=0.01, min_repeats=3, max_repeats=3, clock=lambda: next(ticks)) == 2


def test_count_ops_counts_dispatched_operators():
    x = torch.ones(4)
    assert count_ops(lambda: x + 1) == 1
    assert count_ops(lambda: (x + 1) * 2 + x.sum()) == 4


def test_decode_floor_uses_the_models_bytes_once_for_tied_weights():
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg)
    shape = model_shape(model)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.params < sum(p.numel() for p in model.state_dict().values())  # tied head counted once
    floor = decode_floor(model, ROOF, context_len=10, batch=3, ops=50)
    cost = decode_cost(ModelShape(shape.params, 2, 32, 2, 8, 4), 10, 3)
    assert floor.memory_s == pytest.approx(cost.bytes / ROOF.read_bandwidth)
    assert floor.overhead_s == pytest.approx(50 * ROOF.op_overhead_s)
    bf16 = decode_floor(model.to(torch.bfloat16), ROOF, context_len=10, batch=3, ops=50)
    assert bf16.memory_s == pytest.approx(floor.memory_s / 2)
