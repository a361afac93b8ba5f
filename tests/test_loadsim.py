import numpy as np
import pytest

from servelab import metrics
from servelab.metrics.loadsim import Job, finish_time, poisson_jobs, run_benchmark, simulate_server

DURATION = 60.0
TTFT_SLO, TPOT_SLO = 1.0, 0.040


def test_seeded_runs_are_deterministic():
    assert poisson_jobs(3, DURATION, seed=5) == poisson_jobs(3, DURATION, seed=5)
    assert poisson_jobs(3, DURATION, seed=5) != poisson_jobs(3, DURATION, seed=6)
    jobs = poisson_jobs(3, DURATION)
    assert simulate_server(jobs) == simulate_server(jobs)


def test_poisson_jobs_shape():
    jobs = poisson_jobs(4, DURATION)
    assert all(0 <= j.arrival < DURATION for j in jobs)
    assert [j.arrival for j in jobs] == sorted(j.arrival for j in jobs)
    assert all(32 <= j.prompt_tokens < 512 and 16 <= j.output_tokens < 256 for j in jobs)
    assert abs(len(jobs) - 4 * DURATION) < 4 * np.sqrt(4 * DURATION)


def test_every_job_is_served_with_consistent_timings():
    jobs = poisson_jobs(5, 20.0, seed=1)
    records = simulate_server(jobs)
    assert sorted((r.arrival, r.output_tokens) for r in records) == sorted(
        (j.arrival, j.output_tokens) for j in jobs)
    assert all(isinstance(r, metrics.RequestTiming) for r in records)


def test_low_load_meets_slo_and_goodput_tracks_arrivals():
    rate = 1.0
    records = simulate_server(poisson_jobs(rate, DURATION))
    window = (0.0, DURATION)
    assert metrics.slo_attainment(records, TTFT_SLO, TPOT_SLO) == pytest.approx(1.0, abs=0.02)
    assert metrics.goodput(records, TTFT_SLO, TPOT_SLO, window) == pytest.approx(rate, rel=0.2)


def test_past_saturation_goodput_falls_below_throughput():
    records = simulate_server(poisson_jobs(10, DURATION))
    window = (0.0, DURATION)
    good = metrics.goodput(records, TTFT_SLO, TPOT_SLO, window)
    assert good < 0.5 * metrics.throughputs(records, window).requests_per_s
    assert metrics.slo_attainment(records, TTFT_SLO, TPOT_SLO) < 0.5


def test_finish_time_pauses_during_the_stall():
    assert finish_time(0.0, 1.0, (5.0, 6.0)) == 1.0
    assert finish_time(4.5, 1.0, (5.0, 6.0)) == pytest.approx(6.5)
    assert finish_time(5.5, 1.0, (5.0, 6.0)) == pytest.approx(7.0)


def test_naive_closed_loop_hides_the_stall():
    planned = np.arange(0.0, 60.0, 0.010)
    stall = (30.0, 31.5)
    sent, finished = run_benchmark(planned, 0.002, stall, closed_loop=True)
    _, open_finished = run_benchmark(planned, 0.002, stall, closed_loop=False)
    naive = metrics.percentile(list(finished - sent), 99).value
    corrected = metrics.percentile(list(finished - planned), 99).value
    assert naive < 0.01 and corrected > 0.5 and corrected > 50 * naive
    assert np.allclose(open_finished, finished)  # one worker, FIFO: same finishes either way
    assert np.all(sent >= planned)


def test_bad_inputs():
    with pytest.raises(ValueError, match="rate"):
        poisson_jobs(0, 10.0)
    with pytest.raises(TypeError, match="seed"):
        poisson_jobs(1, 10.0, seed=1.5)
    with pytest.raises(ValueError, match="output_tokens"):
        Job(0.0, 10, 0)
    with pytest.raises(TypeError, match="jobs"):
        simulate_server([(0.0, 10, 10)])
    with pytest.raises(ValueError, match="sorted"):
        simulate_server([Job(1.0, 10, 10), Job(0.5, 10, 10)])
    with pytest.raises(ValueError, match="max_batch"):
        simulate_server([Job(0.0, 10, 10)], max_batch=0)
    with pytest.raises(ValueError, match="service_s"):
        finish_time(0.0, 0.0, (1.0, 2.0))
    with pytest.raises(ValueError, match="stall"):
        finish_time(0.0, 1.0, (2.0, 1.0))
    with pytest.raises(ValueError, match="planned"):
        run_benchmark(np.array([1.0, 0.0]), 0.1, (0.0, 0.0), closed_loop=True)
    with pytest.raises(TypeError, match="closed_loop"):
        run_benchmark(np.array([0.0]), 0.1, (0.0, 0.0), closed_loop=1)
