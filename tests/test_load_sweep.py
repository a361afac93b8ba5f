"""The §2 load sweep: one population per run, so goodput = attainment x completion rate, and bands
over seeds that decide which differences the sweep can claim."""

import math

import pytest

from servelab import metrics as m
from servelab.metrics.loadsim import SWEEP_QUANTITIES, load_sweep, poisson_jobs, simulate_server
from servelab.viz import metrics as vm

SLO = (1.0, 0.040)
RATES = [2, 6, 10]


@pytest.fixture(scope="module")
def sweep():
    return load_sweep(RATES, [0, 1, 2, 3, 4], 30.0, *SLO)


def test_goodput_is_attainment_times_completion_rate_in_every_run(sweep):
    for point in sweep:
        for report in point.reports:
            assert report.met <= report.completed
            assert math.isclose(report.goodput, report.attainment * report.completion_rate,
                                rel_tol=1e-12, abs_tol=1e-15)


def test_the_split_populations_broke_the_identity():
    """Attainment over all records but goodput over the window's completions disagree in overload:
    the bug the window report removes."""
    records = simulate_server(poisson_jobs(10, 30.0, seed=0))
    split = m.slo_attainment(records, *SLO) * m.throughputs(records, (0.0, 30.0)).requests_per_s
    assert not math.isclose(split, m.goodput(records, *SLO, (0.0, 30.0)), rel_tol=0.01)
    report = m.window_report(records, *SLO, (0.0, 30.0))
    assert math.isclose(report.goodput, m.goodput(records, *SLO, (0.0, 30.0)))
    assert report.completion_rate == m.throughputs(records, (0.0, 30.0)).requests_per_s


def test_window_report_counts_the_requests_left_open():
    records = simulate_server(poisson_jobs(10, 30.0, seed=0))
    report = m.window_report(records, *SLO, (0.0, 30.0))
    assert report.completed + report.open_at_close == len(records)
    assert report.open_at_close > 0  # overloaded: a queue is left at the close


def test_bands_hold_their_mean_and_one_value_per_seed(sweep):
    for point in sweep:
        for quantity in SWEEP_QUANTITIES:
            b = point.band(quantity)
            assert b.n == 5 and b.low <= b.mean <= b.high


def test_overload_drops_attainment_beyond_the_band(sweep):
    light, _, heavy = sweep
    assert light.band("attainment").relation_to(heavy.band("attainment")) == "above"
    assert light.band("goodput").relation_to(heavy.band("goodput")) == "above"  # goodput collapses
    assert heavy.band("open_at_close").relation_to(light.band("open_at_close")) == "above"


def test_sweep_is_repeatable_and_seeds_differ():
    a = load_sweep([6], [0, 1], 20.0, *SLO)[0]
    b = load_sweep([6], [0, 1], 20.0, *SLO)[0]
    assert a == b
    assert a.reports[0] != a.reports[1]


def test_band_relation_and_checks():
    low, high = m.band([1.0, 2.0]), m.band([3.0, 4.0])
    assert (low.mean, low.low, low.high, low.n) == (1.5, 1.0, 2.0, 2)
    assert high.relation_to(low) == "above" and low.relation_to(high) == "below"
    assert m.band([1.0, 3.5]).relation_to(high) == "overlaps"
    with pytest.raises(ValueError, match="values"):
        m.band([])
    with pytest.raises(TypeError, match="Band"):
        low.relation_to(2.0)


def test_sweep_arguments_are_checked(sweep):
    with pytest.raises(ValueError, match="rates"):
        load_sweep([], [0], 10.0, *SLO)
    with pytest.raises(ValueError, match="seeds"):
        load_sweep([1], [-1], 10.0, *SLO)
    with pytest.raises(ValueError, match="quantity"):
        sweep[0].band("latency")


def test_sweep_figure_draws_one_band_per_curve(sweep):
    x = [p.rate for p in sweep]
    curves = {q: [p.band(q) for p in sweep] for q in ("completion_rate", "goodput", "attainment")}
    bands = {name: ([b.low for b in curves[q]], [b.high for b in curves[q]])
             for name, q in (("throughput", "completion_rate"), ("goodput", "goodput"),
                             ("attainment", "attainment"))}
    fig = vm.load_sweep_figure(x, *([b.mean for b in curves[q]] for q in curves), bands=bands)
    assert len(fig.data) == 7 and sum(t.fill == "toself" for t in fig.data) == 3
    with pytest.raises(ValueError, match="enclose"):
        vm.load_sweep_figure(x, *([b.mean for b in curves[q]] for q in curves),
                             bands={"goodput": ([9.0] * 3, [10.0] * 3)})
    with pytest.raises(ValueError, match="keys"):
        vm.load_sweep_figure(x, *([b.mean for b in curves[q]] for q in curves), bands={"p90": ([0] * 3,) * 2})
