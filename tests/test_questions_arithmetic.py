"""The arithmetic behind the bank's new answers: MoE parameter counts and a split reduction."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.questions.moe import (MIXTRAL_8X7B, QWEN3_30B_A3B, MoEConfig, expected_distinct_experts,
                                    moe_param_counts)
from servelab.questions.reduction import split_sum


@pytest.mark.parametrize("config, total, active", [(MIXTRAL_8X7B, 46.7, 12.9), (QWEN3_30B_A3B, 30.5, 3.3)])
def test_moe_counts_reproduce_the_published_totals(config, total, active):
    counts = moe_param_counts(config)
    assert round(counts.total / 1e9, 1) == total
    assert abs(counts.active / 1e9 - active) < 0.06  # published active counts are rounded to 0.1B


def test_a_dense_layer_is_a_moe_with_one_expert():
    dense = MoEConfig("dense", 2, 8, 2, 1, 4, 16, 1, 1, 10)
    counts = moe_param_counts(dense)
    assert counts.total == counts.active
    assert counts.expert == 3 * 8 * 16


def test_tied_embeddings_count_once():
    untied = moe_param_counts(MoEConfig("m", 1, 8, 2, 2, 4, 8, 4, 2, 100))
    tied = moe_param_counts(MoEConfig("m", 1, 8, 2, 2, 4, 8, 4, 2, 100, tied_embeddings=True))
    assert untied.total - tied.total == 100 * 8 == untied.active - tied.active


def test_distinct_experts_grow_from_top_k_to_all():
    assert expected_distinct_experts(128, 8, 0) == 0
    assert expected_distinct_experts(128, 8, 1) == pytest.approx(8)
    hits = [expected_distinct_experts(128, 8, t) for t in (1, 4, 16, 64, 1024)]
    assert hits == sorted(hits) and 127.9 < hits[-1] <= 128
    assert expected_distinct_experts(8, 8, 1) == 8


@pytest.mark.parametrize("call, name", [
    (lambda: MoEConfig("m", 1, 8, 2, 2, 4, 8, 4, 5, 100), "top_k"),
    (lambda: MoEConfig("m", 0, 8, 2, 2, 4, 8, 4, 2, 100), "n_layer"),
    (lambda: moe_param_counts("Mixtral"), "config"),
    (lambda: expected_distinct_experts(8, 9, 1), "top_k"),
    (lambda: expected_distinct_experts(8, 2, -1), "tokens"),
])
def test_moe_bad_arguments_name_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_split_sum_depends_on_the_split_in_low_precision():
    values = np.random.default_rng(0).standard_normal(4096)
    sums = {split_sum(values, s) for s in (1, 2, 4, 8, 16, 64)}
    assert len(sums) > 1
    assert max(sums) - min(sums) < 1e-3  # the same sum, up to rounding
    assert split_sum(values, 16) == split_sum(values, 16)
    assert split_sum([0.5, 0.25, 0.125], 3, np.float64) == 0.875


@pytest.mark.parametrize("values, splits, dtype, name", [
    ([], 1, np.float32, "values"),
    ([1.0, float("nan")], 1, np.float32, "values"),
    ([1.0, 2.0], 3, np.float32, "n_splits"),
    ([1.0, 2.0], 1, np.int32, "dtype"),
])
def test_split_sum_rejects_bad_arguments(values, splits, dtype, name):
    with pytest.raises(ValueError, match=name):
        split_sum(values, splits, dtype)
