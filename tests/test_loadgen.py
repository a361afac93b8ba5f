"""servelab.loadgen: seeded workloads, open and closed loops over real HTTP on 127.0.0.1, the coordinated-
omission correction shown on a server that stalls on purpose, reports built on servelab.metrics.latency, the sweep's
saturation point and figure, and a run against the course server."""

import asyncio
import json
import math

import numpy as np
import plotly.graph_objects as go
import pytest
from aiohttp import web

from servelab.loadgen import (SLO, Endpoint, LengthDistribution, RequestResult, RunResult, SweepPoint,
                              build_workload, paced_arrivals, poisson_arrivals, report_table, run_closed_loop,
                              run_open_loop, run_sweep, saturation_index, summarize, sweep_table,
                              throughput_latency_figure)
from servelab.loadgen.__main__ import main as loadgen_main
from tiny_server import tiny_course_server

STALL_S = 1.0
SHORT = LengthDistribution(4, 0.0, 1, 8)


# ------------------------------------------------------------------------------------------ workloads


def test_workload_is_seeded_and_lengths_are_right_skewed():
    dist = LengthDistribution(median=100, sigma=0.8, low=1, high=4000)
    lengths = dist.sample(4000, np.random.default_rng(1))
    assert 85 < np.median(lengths) < 115 and np.mean(lengths) > np.median(lengths)  # lognormal skew
    assert min(lengths) >= 1 and max(lengths) <= 4000
    arrivals = poisson_arrivals(20.0, 50.0, np.random.default_rng(2))
    assert 900 < len(arrivals) < 1100 and all(0 <= a < 50 for a in arrivals)
    a = build_workload(arrivals[:50], dist, SHORT, seed=3)
    assert a == build_workload(arrivals[:50], dist, SHORT, seed=3)
    assert a != build_workload(arrivals[:50], dist, SHORT, seed=4)
    assert [len(s.prompt.split()) for s in a] == dist.sample(50, np.random.default_rng(3))
    assert paced_arrivals(4.0, 3) == [0.0, 0.25, 0.5]


@pytest.mark.parametrize("call, needle", [
    (lambda: LengthDistribution(0, 1.0), "median"),
    (lambda: LengthDistribution(10, -1.0), "sigma"),
    (lambda: LengthDistribution(10, 1.0, low=20, high=30), "median must lie"),
    (lambda: poisson_arrivals(0, 10, np.random.default_rng()), "rate"),
    (lambda: build_workload([1.0, 0.5], SHORT, SHORT, 0), "non-decreasing"),
    (lambda: build_workload([1.0, None], SHORT, SHORT, 0), "not a mix"),
    (lambda: Endpoint("localhost:8000", "m"), "url"),
    (lambda: SLO(0, 1), "ttft_s"),
])
def test_bad_parameters_are_named(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()


# ------------------------------------------------------------------------------------------ coordinated omission


def stalling_app(stall_at: int) -> web.Application:
    """A fake OpenAI endpoint for the load generator's own test: it answers each request at once with two
    streamed chunks, except that when request number ``stall_at`` arrives it stalls for STALL_S seconds,
    and every request arriving during the stall waits for it to end."""
    state = {"count": 0, "stall_until": 0.0}

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        loop = asyncio.get_running_loop()
        state["count"] += 1
        if state["count"] == stall_at:
            state["stall_until"] = loop.time() + STALL_S
        await asyncio.sleep(max(0.0, state["stall_until"] - loop.time()))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for text in ("a", "b"):
            await response.write(f"data: {json.dumps({'choices': [{'index': 0, 'text': text}]})}\n\n".encode())
        usage = {"prompt_tokens": len(body["prompt"].split()), "completion_tokens": 2}
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


async def against_stalling_server(drive):
    runner = web.AppRunner(stalling_app(stall_at=10))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        return await drive(Endpoint(f"http://127.0.0.1:{runner.addresses[0][1]}/v1", "fake", timeout_s=10))
    finally:
        await runner.cleanup()


def test_coordinated_omission_closed_loop_hides_the_stall_planned_arrival_shows_it():
    specs = build_workload(paced_arrivals(50.0, 120), SHORT, SHORT, seed=0)  # one request every 20 ms
    run = asyncio.run(against_stalling_server(lambda ep: run_closed_loop(ep, specs, concurrency=1)))
    assert all(r.ok for r in run.results) and len(run.results) == 120
    steady = summarize(run, SLO(ttft_s=0.5, tpot_s=0.5)).steady
    naive_p99, planned_p99 = steady.naive_e2e[99.0].value, steady.e2e[99.0].value
    assert steady.e2e[99.0].n == 120 and steady.e2e[99.0].enough_samples
    # the naive view saw one slow request out of 120; the planned view charges the stall to the ~50 requests
    # that should have been sent during it
    assert naive_p99 < 0.25 * STALL_S
    assert 0.8 * STALL_S < planned_p99 < 1.3 * STALL_S
    assert max(r.finish_s - r.sent_s for r in run.results) > 0.9 * STALL_S  # the stall itself was seen once
    # requests planned inside the stall waited; their send lag is what the naive view forgets
    assert run.max_send_lag_s > 0.8 * STALL_S
    assert steady.slo_attainment < 0.9


def test_open_loop_keeps_sending_through_the_stall():
    specs = build_workload(paced_arrivals(50.0, 100), SHORT, SHORT, seed=0)
    run = asyncio.run(against_stalling_server(lambda ep: run_open_loop(ep, specs)))
    steady = summarize(run, SLO(ttft_s=0.5, tpot_s=0.5)).steady
    assert steady.n_ok == 100 and run.max_send_lag_s < 0.25 * STALL_S  # the client kept its schedule
    # arrivals did not wait for the server, so even the send-based view sees the stall in its tail
    assert steady.naive_e2e[99.0].value > 0.8 * STALL_S
    assert steady.e2e[99.0].value == pytest.approx(steady.naive_e2e[99.0].value, abs=0.2)


# ------------------------------------------------------------------------------------------ reports and sweeps


def fake_result(index, planned, ttft, n_tokens=4, gap=0.01, status=200):
    emits = tuple(planned + ttft + gap * i for i in range(n_tokens)) if status == 200 else ()
    return RequestResult(index, planned, planned, emits, (emits[-1] if emits else planned) + 0.001, status,
                         error=None if status == 200 else f"HTTP {status}: busy", prompt_tokens=10,
                         completion_tokens=n_tokens if status == 200 else None)


def test_summary_reports_cold_start_apart_and_uses_metrics():
    results = [fake_result(i, i * 0.1, 2.0 if i < 3 else 0.05) for i in range(40)]
    results.append(fake_result(40, 4.0, 0, status=503))
    report = summarize(RunResult("open", tuple(results), 10.0, None, 5.0), SLO(0.5, 0.05), warmup_requests=3)
    assert report.cold.n_requests == 3 and report.cold.ttft[50.0].value == pytest.approx(2.0)
    steady = report.steady
    assert steady.n_requests == 38 and steady.n_ok == 37
    assert steady.ttft[99.0].value == pytest.approx(0.05) and not steady.ttft[99.0].enough_samples
    assert steady.tpot[50.0].value == pytest.approx(0.01)
    assert steady.slo_attainment == pytest.approx(37 / 38)  # the rejected request counts as a miss
    window = steady.window_s[1] - steady.window_s[0]
    assert steady.goodput_requests_per_s == pytest.approx(37 / window)  # a rate, not a fraction
    assert steady.throughputs.total_tokens_per_s == pytest.approx(37 * 14 / window)
    assert report.failures == {"503": 1}
    table = repr(report_table(report))
    assert "cold start" in table and "no (n < 100)" in table


def sweep_point(rate, ttft, gap=0.01):
    """20 requests planned at ``rate``, first token after ``ttft``, then one token every ``gap`` seconds."""
    results = [fake_result(i, i / rate, ttft, gap=gap) for i in range(20)]
    return SweepPoint(rate, summarize(RunResult("open", tuple(results), rate, None, 20 / rate), SLO(1.0, 0.1)))


def test_saturation_index_table_and_figure():
    points = [sweep_point(1, 0.05), sweep_point(2, 0.06), sweep_point(4, 0.3), sweep_point(8, 1.0)]
    assert saturation_index(points) == 2  # p90 TTFT above 3x the idle baseline
    assert saturation_index(points[:2]) is None
    assert saturation_index([sweep_point(1, 0.05), sweep_point(4, 0.05, gap=0.05)]) == 1  # TPOT 5x the idle one
    with pytest.raises(ValueError, match="latency_factor"):
        saturation_index(points, latency_factor=1)
    table = repr(sweep_table(points))
    assert "knee" in table and "goodput req/s" in table
    fig = throughput_latency_figure(points)
    assert isinstance(fig, go.Figure) and len(fig.data) == 4 and fig.layout.yaxis.type == "log"
    assert not math.isnan(fig.data[0].y[0])


# ------------------------------------------------------------------------------------------ against our server


@pytest.fixture(scope="module")
def course_server():
    with tiny_course_server() as server:
        yield server


def test_open_loop_against_the_course_server(course_server):
    outputs = LengthDistribution(8, 0.5, 2, 16)
    specs = build_workload(poisson_arrivals(20.0, 1.5, np.random.default_rng(0)), LengthDistribution(10, 0.5, 2, 40),
                           outputs, seed=0)
    run = asyncio.run(run_open_loop(Endpoint(course_server.url, "tiny"), specs))
    assert all(r.ok for r in run.results), [r.error for r in run.results if not r.ok]
    assert [r.completion_tokens for r in run.results] == [s.max_tokens for s in specs]  # ignore_eos honoured
    report = summarize(run, SLO(1.0, 0.1), warmup_requests=2)
    assert report.steady.throughputs.output_tokens_per_s > 0 and report.cold.n_requests == 2


def test_command_line_closed_loop(course_server, capsys):
    loadgen_main(["--url", course_server.url, "--model", "tiny", "--closed-loop", "--concurrency", "2",
                  "--num-requests", "8", "--prompt-median", "6", "--output-median", "6", "--max-output", "12",
                  "--warmup", "2"])
    out = capsys.readouterr().out
    assert "closed loop, concurrency 2, unpaced" in out and "steady: 6/6 ok" in out and "TTFT" in out


def test_command_line_scrape_reports_the_servers_own_latencies(course_server, capsys):
    loadgen_main(["--url", course_server.url, "--model", "tiny", "--closed-loop", "--concurrency", "2",
                  "--num-requests", "6", "--prompt-median", "6", "--output-median", "6", "--max-output", "12",
                  "--scrape"])
    out = capsys.readouterr().out
    assert "the server's own view" in out and "closed loop, concurrency 2" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("TTFT", "end"))}
    assert rows["TTFT"][1] == "6" and rows["end"][3] == "6"  # six requests seen by the server's histograms


def test_command_line_scrape_names_a_prefix_with_no_metrics(course_server, capsys):
    loadgen_main(["--url", course_server.url, "--model", "tiny", "--closed-loop", "--num-requests", "2",
                  "--prompt-median", "6", "--output-median", "4", "--max-output", "8", "--scrape",
                  "--metrics-prefix", "vllm"])
    assert "no vllm: latency histogram" in capsys.readouterr().out


def test_command_line_scrape_refuses_a_sweep(course_server):
    with pytest.raises(SystemExit, match="--scrape reports one run"):
        loadgen_main(["--url", course_server.url, "--model", "tiny", "--sweep", "1,2", "--scrape"])


def test_sweep_against_the_course_server(course_server):
    endpoint = Endpoint(course_server.url, "tiny")
    points = asyncio.run(run_sweep(endpoint, [2.0, 8.0], 1.0, LengthDistribution(8, 0.5, 2, 20), SHORT,
                                   SLO(1.0, 0.2), seed=1, warmup_requests=1))
    assert [p.rate for p in points][:1] == [2.0] and all(p.report.steady is not None for p in points)
    assert "out tok/s" in repr(sweep_table(points)) and len(throughput_latency_figure(points).data) == 4
