"""The timing discipline: a verdict only when the band leaves 1 by more than the run-to-run drift."""

import pytest

from servelab.bench.timing import (NO_DIFFERENCE, RESOLUTION, Comparison, Timing, bootstrap_median_band,
                                   compare, compare_ratios, time_interleaved)


def test_clear_speedup_is_called_faster():
    a = [2.0, 2.1, 1.9, 2.05, 2.0, 1.95, 2.02]
    b = [1.0, 1.02, 0.98, 1.01, 1.0, 0.99, 1.03]
    c = compare_ratios(a, b)
    assert c.verdict == "faster"
    assert 1.9 < c.ratio < 2.1
    assert c.band[0] > 1.0
    assert "faster" in c.describe("A", "B")


def test_slowdown_is_called_slower():
    c = compare_ratios([1.0] * 5, [1.5, 1.6, 1.4, 1.5, 1.55])
    assert c.verdict == "slower"
    assert c.describe("A", "B").startswith("B is 1.50× slower than A (band 1.4")  # factor and band > 1


def test_noise_gives_no_verdict():
    a = [1.0, 1.2, 0.9, 1.1, 1.0, 0.95]
    b = [1.1, 0.9, 1.05, 1.0, 1.2, 0.92]
    c = compare_ratios(a, b)
    assert c.verdict == NO_DIFFERENCE
    assert c.band[0] <= 1.0 <= c.band[1]
    text = c.describe("A", "B")
    assert "faster" not in text and "slower" not in text


def test_band_is_seeded_and_contains_median():
    values = [0.9, 1.1, 1.0, 1.3, 0.8, 1.05]
    assert bootstrap_median_band(values) == bootstrap_median_band(values)
    low, high = bootstrap_median_band(values)
    assert low <= sorted(values)[3] and high >= sorted(values)[2]


def test_compare_interleaves_and_excludes_warmup():
    calls: list[str] = []
    ticks = iter(range(10_000))
    c = compare(lambda: calls.append("a"), lambda: calls.append("b"), repeats=4, warmup=2,
                clock=lambda: float(next(ticks)))
    assert calls[:4] == ["a", "b", "a", "b"]          # warm-up, untimed
    assert calls[4:] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert len(c.a.samples) == len(c.b.samples) == 4


@pytest.mark.parametrize("kwargs, name", [({"repeats": 2}, "repeats"), ({"warmup": -1}, "warmup")])
def test_bad_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        compare(lambda: None, lambda: None, **kwargs)


def test_unpaired_timings_refused():
    with pytest.raises(ValueError, match="paired"):
        compare_ratios([1.0, 1.0, 1.0], [1.0, 1.0])


def test_time_interleaved_rotates_the_order_and_pairs_rounds():
    calls: list[str] = []
    ticks = iter(range(10_000))
    runs = {name: (lambda n=name: calls.append(n)) for name in "abc"}
    times = time_interleaved(runs, repeats=3, warmup=1, clock=lambda: float(next(ticks)))
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")
    assert {len(t) for t in times.values()} == {3}
    assert compare_ratios(times["a"], times["b"]).verdict == NO_DIFFERENCE


@pytest.mark.parametrize("kwargs, name", [({"repeats": 2}, "repeats"), ({"warmup": -1}, "warmup")])
def test_time_interleaved_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        time_interleaved({"a": lambda: None}, **kwargs)


def test_a_verdict_needs_a_band_that_clears_the_resolution_as_printed():
    def verdict(low: float, high: float) -> str:
        return Comparison(Timing((1.0,)), Timing((1.0,)), 1.0, (low, high)).verdict

    edge = 1 + RESOLUTION
    assert verdict(edge + 0.004, 2.0) == NO_DIFFERENCE  # printed at the edge: not beyond it
    assert verdict(edge + 0.006, 2.0) == "faster"
    assert verdict(1.004, 1.1) == NO_DIFFERENCE  # "1.00–1.10×": reaches 1
    assert verdict(1.08, 1.12) == NO_DIFFERENCE  # leaves 1, not the run-to-run drift
    assert verdict(0.5, 1 / (edge + 0.006)) == "slower"
    assert verdict(0.5, 1 / edge) == NO_DIFFERENCE


def test_a_band_off_one_but_inside_the_drift_says_so():
    c = Comparison(Timing((1.0,)), Timing((1.0,)), 1.1, (1.08, 1.12))
    text = c.describe("A", "B")
    assert text.startswith("B vs A: no measurable difference (1.10×, band 1.08–1.12×, inside the 15 %")
    assert "drifts" not in compare_ratios([1.0, 1.2, 0.9, 1.1, 1.0, 0.95],
                                          [1.1, 0.9, 1.05, 1.0, 1.2, 0.92]).describe("A", "B")
