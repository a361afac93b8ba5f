"""``python -m servelab.loadgen``: load-test any OpenAI-compatible endpoint and print an honest
report.

It speaks two dialects. ``vllm bench serve``'s flags (``--request-rate``, ``--burstiness``,
``--max-concurrency``, ``--num-prompts``, ``--dataset-name``, ``--goodput``, ``--save-result`` ...)
plan ``--num-prompts`` requests, print vLLM's summary and write vLLM's result JSON. The course's own
flags (``--rate`` with ``--duration``, ``--closed-loop``, ``--sweep``, ``--warmup``, ``--ttft-slo``)
drive the course's report: latency from the planned arrival, cold start apart, SLO attainment; any
single run of either kind can also be saved as vLLM's JSON with ``--save-result``.

Examples (URL is e.g. http://127.0.0.1:8000/v1, NAME the model the server lists at URL/models)::

    # vLLM's command line: 200 random prompts, gamma arrivals at 4 req/s, at most 8 in flight
    python -m servelab.loadgen --base-url http://127.0.0.1:8000 --model NAME --dataset-name random \\
        --random-input-len 32 --random-output-len 32 --num-prompts 200 --request-rate 4 --burstiness 0.5 \\
        --max-concurrency 8 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \\
        --goodput ttft:500 tpot:50 --save-result --save-detailed --result-dir results
    # ShareGPT replay, everything at once (rate inf) with 4 in flight: vLLM's closed loop
    python -m servelab.loadgen --url URL --dataset-name sharegpt --dataset-path sharegpt.json \\
        --num-prompts 100 --max-concurrency 4
    # the course's open loop: Poisson arrivals at 2 requests/s for 30 s, first 5 reported as cold start
    python -m servelab.loadgen --url URL --model NAME --rate 2 --duration 30 --warmup 5
    # the course's closed loop: 4 requests always in flight, 100 requests
    python -m servelab.loadgen --url URL --model NAME --closed-loop --concurrency 4 --num-requests 100
    # the same, with the server's own latencies read from its Prometheus /metrics (vLLM: --metrics-prefix vllm)
    python -m servelab.loadgen --url URL --model NAME --rate 2 --duration 30 --scrape
    # sweep from idle to saturation (stops after the knee), with the curve written to HTML
    python -m servelab.loadgen --url URL --model NAME --sweep 0.5,1,2,4,8 --duration 20 --figure sweep.html
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
from datetime import datetime

import aiohttp
import numpy as np

from servelab.loadgen.bench_result import (
    DETAILED_FIELDS,
    GOODPUT_METRICS,
    bench_records,
    bench_summary,
    parse_goodput,
    parse_metric_percentiles,
    parse_percentile_metrics,
    summary_text,
)
from servelab.loadgen.client import Endpoint, RunResult, run_closed_loop, run_open_loop
from servelab.loadgen.datasets import DATASET_NAMES, load_samples, specs_from_samples
from servelab.loadgen.scrape import (
    MetricsSnapshot,
    metrics_url,
    run_with_metrics,
    server_latency_rows,
)
from servelab.loadgen.sweep import (
    SLO,
    LoadReport,
    report_table,
    run_sweep,
    summarize,
    sweep_table,
    throughput_latency_figure,
)
from servelab.loadgen.workload import (
    LengthDistribution,
    RequestSpec,
    build_workload,
    gamma_arrivals,
    paced_arrivals,
    poisson_arrivals,
)
from servelab.viz.core import table

BACKENDS = ("openai", "vllm", "openai-chat")


def _checked(parse):
    """An argparse ``type`` that turns the parser's ValueError into argparse's own error for that
    flag."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__
    return convert


def _rates(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--sweep must be comma-separated numbers, got {text!r}") from None


def _positive_or_inf(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise ValueError(f"must be a number > 0 or inf, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"must be an integer >= 1, got {text!r}")
    return value


def _course_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the course's run modes and report")
    g.add_argument(
        "--rate",
        type=float,
        default=None,
        help="open loop: Poisson arrivals, requests/s, over "
        "--duration; closed loop: optional pacing rate",
    )
    g.add_argument(
        "--duration", type=float, default=30.0, help="seconds of planned arrivals (--rate, --sweep)"
    )
    g.add_argument(
        "--closed-loop",
        action="store_true",
        help="fixed concurrency (--concurrency) instead of arrivals",
    )
    g.add_argument(
        "--sweep",
        type=_checked(_rates),
        default=None,
        help="comma-separated rates for a load sweep",
    )
    g.add_argument("--prompt-median", type=float, default=32, help="median prompt length in words")
    g.add_argument(
        "--prompt-sigma", type=float, default=0.6, help="lognormal sigma of prompt length"
    )
    g.add_argument("--max-prompt", type=int, default=256, help="longest prompt in words")
    g.add_argument("--output-median", type=float, default=32, help="median output length in tokens")
    g.add_argument(
        "--output-sigma", type=float, default=0.6, help="lognormal sigma of output length"
    )
    g.add_argument("--max-output", type=int, default=128, help="longest output in tokens")
    g.add_argument(
        "--warmup", type=int, default=0, help="first N requests reported apart as cold start"
    )
    g.add_argument("--ttft-slo", type=float, default=1.0, help="TTFT objective, seconds")
    g.add_argument("--tpot-slo", type=float, default=0.1, help="TPOT objective, seconds/token")
    g.add_argument("--deadline", type=float, default=None, help="end-to-end objective, seconds")
    g.add_argument(
        "--figure",
        default=None,
        help="sweep only: write the throughput-latency figure to this HTML",
    )
    g.add_argument(
        "--scrape",
        action="store_true",
        help="also report the server's own latencies from its "
        "Prometheus /metrics (next to URL, without /v1), scraped before and after the run",
    )
    g.add_argument(
        "--metrics-prefix", default="servelab", help="metric name prefix: servelab, vllm, ..."
    )


def _vllm_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vllm bench serve's traffic, datasets and result")
    g.add_argument(
        "--request-rate",
        type=_checked(_positive_or_inf),
        default=None,
        help="requests/s of gamma arrivals for --num-prompts requests; inf (default) sends all "
        "at once",
    )
    g.add_argument(
        "--burstiness",
        type=_checked(_positive_or_inf),
        default=1.0,
        help="gamma shape of the gaps: 1 Poisson, < 1 burstier, > 1 more regular, inf even",
    )
    g.add_argument(
        "--max-concurrency",
        "--concurrency",
        dest="max_concurrency",
        type=_checked(_count),
        default=None,
        help="cap on requests in flight (the course's closed loop: 4 when unset)",
    )
    g.add_argument(
        "--num-prompts",
        "--num-requests",
        dest="num_prompts",
        type=_checked(_count),
        default=None,
        help="requests to send (default 1000; 100 with --closed-loop)",
    )
    g.add_argument(
        "--dataset-name",
        choices=DATASET_NAMES,
        default=None,
        help="prompt source (default random; the course's modes default to --prompt-median ...)",
    )
    g.add_argument(
        "--dataset-path", default=None, help="ShareGPT JSON (sharegpt) or JSONL of prompts (custom)"
    )
    g.add_argument("--input-len", type=int, default=None, help="sets --random-input-len")
    g.add_argument(
        "--output-len",
        type=int,
        default=None,
        help="sets the output length of every dataset "
        "(--random-output-len, --sharegpt-output-len, --custom-output-len)",
    )
    g.add_argument(
        "--random-input-len", type=int, default=1024, help="random: mean prompt length (words)"
    )
    g.add_argument(
        "--random-output-len", type=int, default=128, help="random: mean output length (tokens)"
    )
    g.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="random: lengths uniform in [L(1-r), L(1+r)], r in [0, 1)",
    )
    g.add_argument(
        "--sharegpt-output-len",
        type=int,
        default=None,
        help="sharegpt: output length for every request",
    )
    g.add_argument(
        "--custom-output-len",
        type=int,
        default=256,
        help="custom: output length unless a line sets \"output_tokens\"",
    )
    g.add_argument(
        "--disable-shuffle", action="store_true", help="send file datasets in file order"
    )
    g.add_argument("--percentile-metrics", type=_checked(parse_percentile_metrics), default=None,
                   help="metrics to report, out of ttft,tpot,itl,e2el (default ttft,tpot,itl)")
    g.add_argument("--metric-percentiles", type=_checked(parse_metric_percentiles), default=[99.0],
                   help="comma-separated percentiles, e.g. 50,90,99 (default 99)")
    g.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help=f"request goodput bounds in ms, KEY one of {', '.join(GOODPUT_METRICS)}")
    g.add_argument("--save-result", action="store_true", help="write the result JSON")
    g.add_argument(
        "--save-detailed", action="store_true", help="include the per-request arrays in it"
    )
    g.add_argument(
        "--result-dir", default=None, help="folder for the result file (created if missing)"
    )
    g.add_argument("--result-filename", default=None, help="file name (default "
                   "{label}-{request_rate}qps[-concurrencyN]-{model}-{date}.json)")
    g.add_argument("--label", default=None, help="file name prefix (default: the backend)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m servelab.loadgen",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--url",
        default=None,
        help="base URL of the API, ending in /v1 (or --base-url/--host/--port with --endpoint)",
    )
    p.add_argument("--base-url", default=None, help="server root, without /v1 (vLLM's flag)")
    p.add_argument("--host", default="127.0.0.1", help="server host when no URL is given")
    p.add_argument("--port", type=int, default=8000, help="server port when no URL is given")
    p.add_argument("--endpoint", default="/v1/completions", help="API path: /v1/completions or "
                   "/v1/chat/completions")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="openai",
        help="openai and vllm: completions; openai-chat: chat completions",
    )
    p.add_argument(
        "--model", default=None, help="model name (default: the first one the server lists)"
    )
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument(
        "--chat", action="store_true", help="use /chat/completions instead of /completions"
    )
    eos = p.add_mutually_exclusive_group()
    eos.add_argument(
        "--ignore-eos",
        action="store_true",
        default=None,
        help="generate exactly max_tokens (default for random prompts and the course's modes)",
    )
    eos.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", default=None,
                     help="let requests stop at EOS (default for sharegpt/custom)")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals and prompts")
    p.add_argument(
        "--timeout", type=float, default=60.0, help="per-request client timeout, seconds"
    )
    p.add_argument(
        "--time-limit", type=float, default=300.0, help="stop sending after this many seconds"
    )
    _vllm_flags(p)
    _course_flags(p)
    return p


def report_text(report: LoadReport) -> str:
    """A plain-text report: how the run was driven, latency table, throughputs, SLO, goodput,
    failures."""
    how = (
        f"open loop, the seeded plan offers {report.offered_rate or 0:.2f} req/s"
        if report.mode == "open"
        else f"closed loop, concurrency {report.concurrency}"
        + (f", paced at {report.offered_rate:.2f} req/s" if report.offered_rate else ", unpaced")
    )
    lines = [how, repr(report_table(report))]
    for name, phase in (("cold start", report.cold), ("steady", report.steady)):
        if phase is None:
            continue
        lines.append(
            f"{name}: {phase.n_ok}/{phase.n_requests} ok, SLO attainment "
            f"{phase.slo_attainment:.1%}, "
            f"goodput {phase.goodput_requests_per_s:.2f} req/s "
            f"({phase.goodput_tokens_per_s:.1f} tok/s)"
        )
        if phase.throughputs:
            t = phase.throughputs
            lines.append(
                f"  throughput: {t.requests_per_s:.2f} req/s, {t.output_tokens_per_s:.1f} "
                f"output tok/s, "
                f"{t.total_tokens_per_s:.1f} total tok/s"
            )
    lines.append(f"failures: {report.failures or 'none'}; unsent: {report.unsent}; "
                 f"client send lag max {report.max_send_lag_s * 1000:.1f} ms")
    return "\n".join(lines)


def server_text(snapshots: list[MetricsSnapshot], prefix: str) -> str:
    """The server's latencies over the run (first to last snapshot), or why there are none."""
    rows = server_latency_rows(snapshots[0], snapshots[-1], prefix)
    if not rows:
        return (
            f"server /metrics: no {prefix}: latency histogram gained observations (check "
            f"--metrics-prefix)"
        )
    return repr(table(rows, caption="the server's own view, from its /metrics",
                      formats={k: ".1f" for k in ("mean_ms", "p50_ms", "p90_ms")}))


async def _measured(run, args: argparse.Namespace) -> RunResult:
    """Await the run; with ``--scrape``, scrape the server around it and print its own latencies."""
    if not args.scrape:
        return await run
    result, snapshots = await run_with_metrics(run, metrics_url(args.url))
    print(server_text(snapshots, args.metrics_prefix))
    return result


def run_mode(args: argparse.Namespace) -> str:
    """``sweep``, ``closed`` or ``open`` (the course's modes) or ``bench`` (vLLM's); conflicts
    raise."""
    if args.request_rate is not None and (args.rate is not None or args.sweep or args.closed_loop):
        raise ValueError(
            "--request-rate is vLLM's open loop; it cannot be combined with --rate, --sweep or "
            "--closed-loop (pace a closed loop with --rate)"
        )
    if args.sweep:
        if args.scrape:
            raise ValueError("--scrape reports one run; it cannot be combined with --sweep")
        if args.dataset_name or args.save_result:
            raise ValueError(
                "--sweep uses the course's --prompt-median ... lengths and prints a table; "
                "it takes no --dataset-name or --save-result"
            )
        return "sweep"
    if args.closed_loop:
        return "closed"
    return "open" if args.rate is not None else "bench"


def endpoint_url(args: argparse.Namespace) -> tuple[str, bool]:
    """The API base ending in /v1 and whether to use chat completions, from --url or vLLM's
    flags."""
    chat = args.chat or args.backend == "openai-chat"
    if args.url is not None:
        if args.base_url is not None:
            raise ValueError("give --url (ending in /v1) or --base-url (the server root), not both")
        return args.url, chat
    root = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    for suffix, is_chat in (("/chat/completions", True), ("/completions", False)):
        if args.endpoint.endswith(suffix):
            if chat != is_chat:
                raise ValueError(
                    f"--backend {args.backend} does not match --endpoint {args.endpoint}"
                )
            return root + args.endpoint[:-len(suffix)], is_chat
    raise ValueError(
        f"--endpoint must end in /completions or /chat/completions, got {args.endpoint!r}"
    )


def _dataset(args: argparse.Namespace, mode: str) -> str | None:
    return args.dataset_name or ("random" if mode == "bench" else None)


def _general(value: int | None, specific: int | None) -> int | None:
    """vLLM's --input-len/--output-len, when given, override the dataset-specific length flags."""
    return specific if value is None else value


def _specs(args: argparse.Namespace, mode: str) -> list[RequestSpec]:
    """The seeded plan: arrival offsets from the mode's flags, prompts from the dataset or the
    course."""
    if mode == "closed":
        count = args.num_prompts or 100
        arrivals = paced_arrivals(args.rate, count) if args.rate else [None] * count
    elif mode == "open":
        arrivals = poisson_arrivals(args.rate, args.duration, np.random.default_rng(args.seed))
    else:
        rate = args.request_rate if args.request_rate is not None else math.inf
        arrivals = gamma_arrivals(
            rate, args.num_prompts or 1000, args.burstiness, np.random.default_rng(args.seed)
        )
    if not arrivals:
        raise ValueError("the plan holds no request: raise --rate or --duration")
    dataset = _dataset(args, mode)
    if dataset is None:
        return build_workload(arrivals, *_course_lengths(args), args.seed)
    samples = load_samples(dataset, len(arrivals), args.seed, args.dataset_path,
                           random_input_len=_general(args.input_len, args.random_input_len),
                           random_output_len=_general(args.output_len, args.random_output_len),
                           random_range_ratio=args.random_range_ratio,
                           sharegpt_output_len=_general(args.output_len, args.sharegpt_output_len),
                           custom_output_len=_general(args.output_len, args.custom_output_len),
                           shuffle=not args.disable_shuffle)
    return specs_from_samples(samples, arrivals)


def _course_lengths(args: argparse.Namespace) -> tuple[LengthDistribution, LengthDistribution]:
    return (LengthDistribution(args.prompt_median, args.prompt_sigma, 1, args.max_prompt),
            LengthDistribution(args.output_median, args.output_sigma, 1, args.max_output))


async def first_model(url: str, api_key: str | None) -> str:
    """The first model the server lists at URL/models (what vLLM does without --model)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url.rstrip("/") + "/models", headers=headers,
                                   timeout=aiohttp.ClientTimeout(total=30)) as resp:
                data = await resp.json(content_type=None)
        return data["data"][0]["id"]
    except (
        aiohttp.ClientError,
        asyncio.TimeoutError,
        ValueError,
        KeyError,
        IndexError,
        TypeError,
    ) as exc:
        raise ValueError(
            f"no --model given and none could be read from {url}/models "
            f"({exc.__class__.__name__}: {exc})"
        ) from None


def result_json(
    args: argparse.Namespace,
    mode: str,
    run: RunResult,
    specs: list[RequestSpec],
    model: str,
    goodput: dict[str, float] | None,
) -> dict:
    """vLLM's result JSON for one run: its header (date, backend, traffic) and
    :func:`bench_summary`."""
    if mode == "bench":
        rate = args.request_rate if args.request_rate is not None else math.inf
        concurrency = args.max_concurrency
    else:
        rate = args.rate if args.rate is not None else math.inf
        concurrency = run.concurrency or args.max_concurrency
    metrics = args.percentile_metrics or ["ttft", "tpot", "itl"]
    records = bench_records(run, specs)
    summary = bench_summary(records, run.wall_s, metrics, args.metric_percentiles, goodput)
    header = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": args.backend,
              "backend": args.backend, "label": args.label, "model_id": model, "tokenizer_id": None,
              "num_prompts": len(specs), "request_rate": rate if rate < math.inf else "inf",
              "burstiness": args.burstiness, "max_concurrency": concurrency}
    merged = {**header, **summary, **records}
    return {k: v for k, v in merged.items() if args.save_detailed or k not in DETAILED_FIELDS}


def result_path(args: argparse.Namespace, result: dict) -> str:
    """Where --save-result writes: vLLM's default name, or --result-filename, inside
    --result-dir."""
    rate = float(result["request_rate"]) if result["request_rate"] != "inf" else math.inf
    concurrency = (
        f"-concurrency{result['max_concurrency']}" if result["max_concurrency"] is not None else ""
    )
    name = args.result_filename or (f"{args.label or args.backend}-{rate}qps{concurrency}-"
                                    f"{result['model_id'].split('/')[-1]}-{result['date']}.json")
    if args.result_dir:
        os.makedirs(args.result_dir, exist_ok=True)
        name = os.path.join(args.result_dir, name)
    return name


def _ignore_eos(args: argparse.Namespace, mode: str) -> bool:
    if args.ignore_eos is not None:
        return args.ignore_eos
    return _dataset(args, mode) in (None, "random")


async def _sweep(args: argparse.Namespace, endpoint: Endpoint, slo: SLO) -> None:
    points = await run_sweep(
        endpoint,
        args.sweep,
        args.duration,
        *_course_lengths(args),
        slo,
        args.seed,
        args.warmup,
        time_limit_s=args.time_limit,
    )
    print(repr(sweep_table(points)))
    if args.figure:
        throughput_latency_figure(points).write_html(args.figure, include_plotlyjs=True)
        print(f"figure written to {args.figure}")


async def _main(args: argparse.Namespace) -> dict | None:
    mode = run_mode(args)
    # bad bounds stop before any request
    goodput = parse_goodput(args.goodput) if args.goodput else None
    args.url, chat = endpoint_url(args)
    model = args.model or await first_model(args.url, args.api_key)
    endpoint = Endpoint(args.url, model, args.api_key, chat, _ignore_eos(args, mode), args.timeout)
    slo = SLO(args.ttft_slo, args.tpot_slo, args.deadline)
    if mode == "sweep":
        await _sweep(args, endpoint, slo)
        return None
    specs = _specs(args, mode)
    if mode == "closed":
        run = run_closed_loop(endpoint, specs, args.max_concurrency or 4, args.time_limit)
    else:
        cap = args.max_concurrency or (256 if mode == "open" else len(specs))
        run = run_open_loop(endpoint, specs, max_in_flight=cap, time_limit_s=args.time_limit)
    run = await _measured(run, args)
    result = result_json(args, mode, run, specs, model, goodput)
    if mode == "bench":
        print(
            summary_text(
                result, args.percentile_metrics or ["ttft", "tpot", "itl"], args.metric_percentiles
            )
        )
    else:
        print(report_text(summarize(run, slo, args.warmup)))
    if args.save_result:
        path = result_path(args, result)
        with open(path, "w", encoding="utf-8") as out:
            json.dump(result, out)
        print(f"result written to {path}")
    return result


def main(argv: list[str] | None = None) -> dict | None:
    """Parse ``argv``, run, print; returns vLLM's result dict for a single run (None for a
    sweep)."""
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_main(args))
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
