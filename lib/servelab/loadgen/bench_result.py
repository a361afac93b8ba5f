"""A run's result in ``vllm bench serve``'s JSON: the same keys, the same definitions.

:func:`bench_records` turns each :class:`~servelab.loadgen.client.RequestResult` into the
per-request record vLLM keeps, and :func:`bench_summary` computes vLLM's summary from those records
alone, so a reader (or a test) can recompute every figure from the saved arrays:

* TTFT: first content chunk minus the request's *send* (vLLM measures from the send, not from a
  planned arrival; a request held back by ``--max-concurrency`` waits in ``queue_times`` instead);
* E2EL (``latencies``): last content chunk minus the send;
* TPOT, per request with more than one output token: ``(E2EL - TTFT) / (output_len - 1)``;
* ITL: every gap between consecutive content chunks, pooled over all requests;
* ``output_lens`` from the server's ``usage.completion_tokens`` (chunks counted when it sends none),
  ``input_lens`` from ``usage.prompt_tokens`` (the prompt's word count when it sends none);
* ``duration``: from the start of the run to the end of its last request; throughputs are counts
  over it; ``request_goodput`` counts requests meeting every ``--goodput`` bound (a request with one
  output token has TPOT 0 there, as in vLLM);
* statistics: numpy mean, median, population std and linear-interpolation percentiles, in ms
  (0 when no value exists), keyed ``mean_ttft_ms``, ``p99_ttft_ms``, ``p99.9_itl_ms``, ...;
* ``max_concurrent_requests``: peak number of successful requests in flight, over the half-open
  intervals [send, last chunk); ``max_output_tokens_per_s``: most content chunks in one 1-s bucket.

System boundary: the client; seconds in the records, milliseconds in the statistics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from servelab.loadgen.client import RunResult
from servelab.loadgen.workload import RequestSpec

__all__ = [
    "PERCENTILE_METRICS",
    "GOODPUT_METRICS",
    "DETAILED_FIELDS",
    "bench_records",
    "bench_summary",
    "percentile_key",
    "summary_text",
    "parse_percentile_metrics",
    "parse_metric_percentiles",
    "parse_goodput",
]

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
# what vLLM drops from the saved result unless --save-detailed
DETAILED_FIELDS = (
    "input_lens",
    "output_lens",
    "start_times",
    "ttfts",
    "itls",
    "generated_texts",
    "errors",
)


def bench_records(run: RunResult, specs: Sequence[RequestSpec]) -> dict[str, list]:
    """vLLM's per-request arrays, in request order; a failed request has zeros and its error
    text."""
    if not isinstance(run, RunResult):
        raise TypeError("run must be a RunResult")
    prompts = {s.index: s.prompt for s in specs}
    records: dict[str, list] = {
        k: []
        for k in (
            "input_lens",
            "output_lens",
            "ttfts",
            "itls",
            "latencies",
            "start_times",
            "queue_times",
            "generated_texts",
            "errors",
        )
    }
    for r in sorted(run.results, key=lambda r: r.index):
        emits = r.emit_s if r.ok else ()
        records["input_lens"].append(r.prompt_tokens if r.prompt_tokens is not None
                                     else len(prompts.get(r.index, "").split()))
        records["output_lens"].append((r.completion_tokens or len(emits)) if r.ok else 0)
        records["ttfts"].append(emits[0] - r.sent_s if emits else 0.0)
        records["itls"].append([b - a for a, b in zip(emits, emits[1:])])
        records["latencies"].append(emits[-1] - r.sent_s if emits else 0.0)
        records["start_times"].append(r.sent_s)
        records["queue_times"].append(r.sent_s - r.planned_s if r.planned_s is not None else 0.0)
        records["generated_texts"].append(r.text)
        records["errors"].append("" if r.ok else (r.error or "no content chunk in the stream"))
    return records


def percentile_key(p: float, metric: str) -> str:
    """vLLM's key for a percentile: ``p99_ttft_ms``, ``p99.9_ttft_ms``."""
    word = str(int(p)) if int(p) == p else str(p)
    return f"p{word}_{metric}_ms"


def _stats(values: list[float], metric: str, percentiles: Sequence[float]) -> dict[str, float]:
    data = np.asarray(values or [0.0], dtype=float) * 1000
    out = {f"mean_{metric}_ms": float(np.mean(data)), f"median_{metric}_ms": float(np.median(data)),
           f"std_{metric}_ms": float(np.std(data))}
    out.update({percentile_key(p, metric): float(np.percentile(data, p)) for p in percentiles})
    return out


def _peak_concurrency(starts: list[float], ends: list[float]) -> int:
    # a departure first on a tie
    events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends])
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def _peak_tokens_per_s(records: Mapping[str, list], ok: list[int]) -> float:
    starts = [records["start_times"][i] for i in ok]
    first = min(starts)
    buckets: dict[int, int] = {}
    for i in ok:
        t = records["start_times"][i] + records["ttfts"][i]
        for gap in [0.0, *records["itls"][i]]:
            t += gap
            buckets[int(t - first)] = buckets.get(int(t - first), 0) + 1
    return float(max(buckets.values()))


def bench_summary(
    records: Mapping[str, list],
    duration: float,
    metrics: Sequence[str] = ("ttft", "tpot", "itl"),
    percentiles: Sequence[float] = (99.0,),
    goodput: Mapping[str, float] | None = None,
) -> dict:
    """vLLM's summary of one run, computed from :func:`bench_records`' arrays and the run's duration
    (s)."""
    if (
        isinstance(duration, bool)
        or not isinstance(duration, (int, float))
        or not 0 < duration < math.inf
    ):
        raise ValueError(f"duration must be a finite number > 0, got {duration!r}")
    ok = [i for i, e in enumerate(records["errors"]) if not e]
    ttfts = [records["ttfts"][i] for i in ok]
    e2els = [records["latencies"][i] for i in ok]
    outs = [records["output_lens"][i] for i in ok]
    tpots_all = [(e - t) / (n - 1) if n > 1 else 0.0 for t, e, n in zip(ttfts, e2els, outs)]
    values = {"ttft": ttfts, "e2el": e2els, "tpot": [v for v, n in zip(tpots_all, outs) if n > 1],
              "itl": [gap for i in ok for gap in records["itls"][i]]}
    total_in = sum(records["input_lens"][i] for i in ok)
    total_out = sum(records["output_lens"])
    summary = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(records["errors"]) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput": None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "max_output_tokens_per_s": _peak_tokens_per_s(records, ok) if ok else 0.0,
        "max_concurrent_requests": _peak_concurrency(
            [records["start_times"][i] for i in ok],
            [records["start_times"][i] + records["latencies"][i] for i in ok],
        ),
    }
    if goodput:
        per_request = {"ttft": ttfts, "tpot": tpots_all, "e2el": e2els}
        good = sum(all(per_request[m][j] <= bound_ms / 1000 for m, bound_ms in goodput.items())
                   for j in range(len(ok)))
        summary["request_goodput"] = good / duration
    for metric in metrics:
        summary.update(_stats(values[metric], metric, percentiles))
    return summary


_HEADERS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}


def summary_text(result: Mapping, metrics: Sequence[str], percentiles: Sequence[float]) -> str:
    """The result printed the way ``vllm bench serve`` prints it (labels padded to 40
    characters)."""
    def row(label: str, value, fmt: str = "<10.2f") -> str:
        return f"{label:<40} {value:{fmt}}"

    lines = [
        "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
        row("Successful requests:", result["completed"], "<10"),
        row("Failed requests:", result["failed"], "<10"),
    ]
    if result.get("max_concurrency") is not None:
        lines.append(row("Maximum request concurrency:", result["max_concurrency"], "<10"))
    if result.get("request_rate", "inf") != "inf":
        lines.append(row("Request rate configured (RPS):", result["request_rate"]))
    lines += [row("Benchmark duration (s):", result["duration"]),
              row("Total input tokens:", result["total_input_tokens"], "<10"),
              row("Total generated tokens:", result["total_output_tokens"], "<10"),
              row("Request throughput (req/s):", result["request_throughput"])]
    if result.get("request_goodput") is not None:
        lines.append(row("Request goodput (req/s):", result["request_goodput"]))
    lines += [row("Output token throughput (tok/s):", result["output_throughput"]),
              row("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"]),
              row("Peak concurrent requests:", result["max_concurrent_requests"]),
              row("Total token throughput (tok/s):", result["total_token_throughput"])]
    for metric in metrics:
        short, header = _HEADERS[metric]
        lines += ["{s:{c}^{n}}".format(s=header, n=50, c="-"),
                  row(f"Mean {short} (ms):", result[f"mean_{metric}_ms"]),
                  row(f"Median {short} (ms):", result[f"median_{metric}_ms"])]
        for p in percentiles:
            key = percentile_key(p, metric)
            lines.append(row(f"{key.split('_')[0].upper()} {short} (ms):", result[key]))
    return "\n".join(lines + ["=" * 50])


def parse_percentile_metrics(text: str) -> list[str]:
    """``--percentile-metrics``: comma-separated names out of ttft, tpot, itl, e2el."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in PERCENTILE_METRICS]
    if not names or bad:
        raise ValueError(
            f"--percentile-metrics takes a comma-separated list of "
            f"{', '.join(PERCENTILE_METRICS)}; "
            f"got {text!r}"
        )
    return names


def parse_metric_percentiles(text: str) -> list[float]:
    """``--metric-percentiles``: comma-separated numbers in [0, 100], e.g. ``50,90,99``."""
    try:
        values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        values = []
    if not values or not all(0 <= p <= 100 for p in values):
        raise ValueError(
            f"--metric-percentiles takes comma-separated numbers in [0, 100], got {text!r}"
        )
    return values


def parse_goodput(pairs: Sequence[str]) -> dict[str, float]:
    """``--goodput``: ``KEY:MS`` pairs with KEY one of ttft, tpot, e2el and MS a number >= 0
    (milliseconds)."""
    bounds: dict[str, float] = {}
    for pair in pairs:
        name, _, value = pair.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = math.nan
        if name not in GOODPUT_METRICS or not 0 <= ms < math.inf:
            raise ValueError(
                f"--goodput takes KEY:MS pairs with KEY one of {', '.join(GOODPUT_METRICS)} and MS "
                f"a number >= 0 in milliseconds; got {pair!r}"
            )
        bounds[name] = ms
    return bounds
