"""The arithmetic behind the bank's new answers: a split reduction (MoE counts: test_serving_frontier)."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.questions.reduction import split_sum


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
