"""``python -m servelab.loadgen``: load-test any OpenAI-compatible endpoint and print an honest report.

Examples (URL is e.g. http://127.0.0.1:8000/v1, NAME the model the server lists at URL/models)::

    # open loop: Poisson arrivals at 2 requests/s for 30 s, first 5 requests reported as cold start
    python -m servelab.loadgen --url URL --model NAME --rate 2 --duration 30 --warmup 5
    # closed loop: 4 requests always in flight, 100 requests
    python -m servelab.loadgen --url URL --model NAME --closed-loop --concurrency 4 --num-requests 100
    # the same, with the server's own latencies read from its Prometheus /metrics (vLLM: --metrics-prefix vllm)
    python -m servelab.loadgen --url URL --model NAME --rate 2 --duration 30 --scrape
    # sweep from idle to saturation (stops after the knee), with the curve written to HTML
    python -m servelab.loadgen --url URL --model NAME --sweep 0.5,1,2,4,8 --duration 20 --figure sweep.html
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np

from servelab.loadgen.client import Endpoint, RunResult, run_closed_loop, run_open_loop
from servelab.loadgen.scrape import MetricsSnapshot, metrics_url, run_with_metrics, server_latency_rows
from servelab.loadgen.sweep import (SLO, LoadReport, report_table, run_sweep, summarize, sweep_table,
                                    throughput_latency_figure)
from servelab.loadgen.workload import LengthDistribution, build_workload, paced_arrivals, poisson_arrivals
from servelab.viz.core import table


def _rates(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sweep must be comma-separated numbers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m servelab.loadgen", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", required=True, help="base URL of the API, ending in /v1")
    p.add_argument("--model", required=True, help="model name the server expects")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--chat", action="store_true", help="use /chat/completions instead of /completions")
    p.add_argument("--no-ignore-eos", action="store_true", help="let requests stop at EOS (output lengths vary)")
    p.add_argument("--rate", type=float, default=None, help="open loop: Poisson arrivals, requests/s; "
                   "closed loop: optional pacing rate")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of planned arrivals (open loop, sweep)")
    p.add_argument("--closed-loop", action="store_true", help="fixed concurrency instead of open-loop arrivals")
    p.add_argument("--concurrency", type=int, default=4, help="closed loop: requests in flight")
    p.add_argument("--num-requests", type=int, default=100, help="closed loop: requests to send")
    p.add_argument("--sweep", type=_rates, default=None, help="comma-separated rates for a load sweep")
    p.add_argument("--prompt-median", type=float, default=32, help="median prompt length in words")
    p.add_argument("--prompt-sigma", type=float, default=0.6, help="lognormal sigma of prompt length")
    p.add_argument("--max-prompt", type=int, default=256, help="longest prompt in words")
    p.add_argument("--output-median", type=float, default=32, help="median output length in tokens")
    p.add_argument("--output-sigma", type=float, default=0.6, help="lognormal sigma of output length")
    p.add_argument("--max-output", type=int, default=128, help="longest output in tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals and lengths")
    p.add_argument("--warmup", type=int, default=0, help="first N requests reported apart as cold start")
    p.add_argument("--ttft-slo", type=float, default=1.0, help="TTFT objective, seconds")
    p.add_argument("--tpot-slo", type=float, default=0.1, help="TPOT objective, seconds/token")
    p.add_argument("--deadline", type=float, default=None, help="end-to-end objective, seconds")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request client timeout, seconds")
    p.add_argument("--time-limit", type=float, default=300.0, help="stop sending after this many seconds")
    p.add_argument("--figure", default=None, help="sweep only: write the throughput-latency figure to this HTML")
    p.add_argument("--scrape", action="store_true", help="also report the server's own latencies from its "
                   "Prometheus /metrics (next to URL, without /v1), scraped before and after the run")
    p.add_argument("--metrics-prefix", default="servelab", help="metric name prefix: servelab, vllm, ...")
    return p


def report_text(report: LoadReport) -> str:
    """A plain-text report: how the run was driven, latency table, throughputs, SLO, goodput, failures."""
    how = (f"open loop, the seeded plan offers {report.offered_rate or 0:.2f} req/s" if report.mode == "open" else
           f"closed loop, concurrency {report.concurrency}"
           + (f", paced at {report.offered_rate:.2f} req/s" if report.offered_rate else ", unpaced"))
    lines = [how, repr(report_table(report))]
    for name, phase in (("cold start", report.cold), ("steady", report.steady)):
        if phase is None:
            continue
        lines.append(f"{name}: {phase.n_ok}/{phase.n_requests} ok, SLO attainment {phase.slo_attainment:.1%}, "
                     f"goodput {phase.goodput_requests_per_s:.2f} req/s ({phase.goodput_tokens_per_s:.1f} tok/s)")
        if phase.throughputs:
            t = phase.throughputs
            lines.append(f"  throughput: {t.requests_per_s:.2f} req/s, {t.output_tokens_per_s:.1f} output tok/s, "
                         f"{t.total_tokens_per_s:.1f} total tok/s")
    lines.append(f"failures: {report.failures or 'none'}; unsent: {report.unsent}; "
                 f"client send lag max {report.max_send_lag_s * 1000:.1f} ms")
    return "\n".join(lines)


def server_text(snapshots: list[MetricsSnapshot], prefix: str) -> str:
    """The server's latencies over the run (first to last snapshot), or why there are none."""
    rows = server_latency_rows(snapshots[0], snapshots[-1], prefix)
    if not rows:
        return f"server /metrics: no {prefix}: latency histogram gained observations (check --metrics-prefix)"
    return repr(table(rows, caption="the server's own view, from its /metrics",
                      formats={k: ".1f" for k in ("mean_ms", "p50_ms", "p90_ms")}))


async def _measured(run, args: argparse.Namespace) -> RunResult:
    """Await the run; with ``--scrape``, scrape the server around it and print its own latencies."""
    if not args.scrape:
        return await run
    result, snapshots = await run_with_metrics(run, metrics_url(args.url))
    print(server_text(snapshots, args.metrics_prefix))
    return result


async def _main(args: argparse.Namespace) -> None:
    endpoint = Endpoint(args.url, args.model, args.api_key, args.chat, not args.no_ignore_eos, args.timeout)
    prompts = LengthDistribution(args.prompt_median, args.prompt_sigma, 1, args.max_prompt)
    outputs = LengthDistribution(args.output_median, args.output_sigma, 1, args.max_output)
    slo = SLO(args.ttft_slo, args.tpot_slo, args.deadline)
    if args.sweep:
        if args.scrape:
            raise SystemExit("--scrape reports one run; it cannot be combined with --sweep")
        points = await run_sweep(endpoint, args.sweep, args.duration, prompts, outputs, slo, args.seed,
                                 args.warmup, time_limit_s=args.time_limit)
        print(repr(sweep_table(points)))
        if args.figure:
            throughput_latency_figure(points).write_html(args.figure, include_plotlyjs=True)
            print(f"figure written to {args.figure}")
        return
    if args.closed_loop:
        arrivals = (paced_arrivals(args.rate, args.num_requests) if args.rate else [None] * args.num_requests)
        specs = build_workload(arrivals, prompts, outputs, args.seed)
        run = await _measured(run_closed_loop(endpoint, specs, args.concurrency, args.time_limit), args)
    else:
        if args.rate is None:
            raise SystemExit("--rate is required for an open loop (or use --closed-loop / --sweep)")
        specs = build_workload(poisson_arrivals(args.rate, args.duration, np.random.default_rng(args.seed)),
                               prompts, outputs, args.seed)
        if not specs:
            raise SystemExit("the plan holds no request: raise --rate or --duration")
        run = await _measured(run_open_loop(endpoint, specs, time_limit_s=args.time_limit), args)
    print(report_text(summarize(run, slo, args.warmup)))


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        asyncio.run(_main(args))
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
