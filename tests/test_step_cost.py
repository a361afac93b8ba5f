"""Decode step cost against batch size: the fit recovers a known line, the measurement runs full batches."""

from __future__ import annotations

import pytest
import torch

from servelab.model import LlamaConfig, LlamaForCausalLM
from servelab.optimizations.step_cost import fit_step_cost, measure_decode_step

torch.set_num_threads(1)


def test_fit_recovers_fixed_and_per_sequence_cost():
    sizes = [1, 2, 4, 8, 16, 32, 64]
    fit = fit_step_cost(sizes, [2.0 + 0.25 * b for b in sizes])
    assert fit.fixed == pytest.approx(2.0) and fit.per_sequence == pytest.approx(0.25)
    assert fit.knee_batch == pytest.approx(8.0)


def test_fit_fixed_part_never_above_the_smallest_step():
    # a step that grows less than linearly: a free line would start above the 1-sequence step
    sizes, times = [1, 2, 4, 8, 16, 32], [100.0, 140.0, 170.0, 200.0, 230.0, 270.0]
    fit = fit_step_cost(sizes, times)
    assert 0 < fit.fixed <= min(times)
    assert fit.fixed + fit.per_sequence * 1 == pytest.approx(100.0)  # pinned through the smallest step


def test_fit_weighs_points_by_relative_error():
    # flat, then steep: the few-sequence points are not swamped by the 64-sequence one
    sizes, times = [1, 2, 4, 8, 16, 32, 64], [10.0, 10.0, 10.0, 10.5, 12.0, 40.0, 150.0]
    fit = fit_step_cost(sizes, times)
    assert 5.0 < fit.fixed <= 10.0


def test_fit_rejects_degenerate_input():
    with pytest.raises(ValueError, match="distinct batch sizes"):
        fit_step_cost([4, 4], [1.0, 2.0])
    with pytest.raises(ValueError, match="both must be > 0"):
        fit_step_cost([1, 2, 4], [3.0, 2.0, 1.0])


def test_measurement_grows_with_the_batch():
    from servelab.model import load_tokenizer

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    tokenizer = load_tokenizer()
    small = measure_decode_step(model, tokenizer, 1, 16, steps=3)
    large = measure_decode_step(model, tokenizer, 256, 16, steps=3)
    assert 0 < small < large  # 256 sequences cost more than one, whatever the machine
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        measure_decode_step(model, tokenizer, 0, 16)


def test_figure_draws_the_measured_curve_and_the_knee():
    from servelab.optimizations.step_cost import StepCostFit
    from servelab.viz.step_cost import step_cost_figure

    fit = StepCostFit(fixed=1.0, per_sequence=0.1)
    fig = step_cost_figure([1, 10, 100], [1.1, 2.0, 11.0], fit)
    assert len(fig.data) == 4
    assert list(fig.data[2].y) == pytest.approx([1.1, 0.2, 0.11])  # per-sequence view is measured / B
    assert "Knee at about 10 sequences" in fig.layout.title.text
    with pytest.raises(ValueError, match="equal length"):
        step_cost_figure([1, 2], [1.0], fit)
