"""Read a server's Prometheus ``/metrics`` from the load generator, before, during and after a run.

A scrape is parsed with ``prometheus_client.parser`` into a :class:`MetricsSnapshot` (one value per
series). Two snapshots bracket a run, so the difference of a counter or histogram between them
belongs to the run's requests alone (on a server nobody else uses): :func:`histogram_delta` gives
their count, sum and buckets, a mean and quantiles interpolated inside the buckets the way
Prometheus' ``histogram_quantile`` does. :func:`run_with_metrics` scrapes every ``interval_s`` while
a run goes on, so gauges (queue length, KV use) can be drawn over the run.

System boundary: the server's own measurements, read over HTTP; they say nothing about the network
or the client. Snapshot instants are seconds on ``time.perf_counter``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from servelab._validate import require_real

__all__ = [
    "MetricsSnapshot",
    "HistogramDelta",
    "SERVER_LATENCIES",
    "parse_metrics",
    "metrics_url",
    "scrape",
    "histogram_delta",
    "latency_ms",
    "server_latency_rows",
    "run_with_metrics",
]

Labels = tuple[tuple[str, str], ...]

SERVER_LATENCIES = (
    ("queue time", "request_queue_time_seconds"),
    ("TTFT", "time_to_first_token_seconds"),
    ("inter-token latency", "inter_token_latency_seconds"),
    ("end to end", "e2e_request_latency_seconds"),
)
"""The latency histograms a vLLM-style server exports (name after its ``prefix:``), as ``(label,
name)``."""


@dataclass(frozen=True)
class MetricsSnapshot:
    """Every sample of one scrape: ``(sample name, sorted labels) -> value``, taken at ``at_s``."""

    at_s: float
    samples: dict[tuple[str, Labels], float]

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples called ``name`` whose labels include ``labels`` (0.0 when there are
        none)."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= set(ls))


def parse_metrics(text: str, at_s: float = 0.0) -> MetricsSnapshot:
    """Parse Prometheus' text exposition format."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return MetricsSnapshot(at_s, samples)


def metrics_url(api_url: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port/metrics`` (vLLM and servelab serve it at the
    root)."""
    return api_url.rstrip("/").removesuffix("/v1") + "/metrics"


async def scrape(
    session: aiohttp.ClientSession, url: str, timeout_s: float = 10.0
) -> MetricsSnapshot:
    """GET ``url`` and parse it; raises ``aiohttp.ClientError`` for a server that does not answer
    200."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        resp.raise_for_status()
        return parse_metrics(await resp.text(), time.perf_counter())


@dataclass(frozen=True)
class HistogramDelta:
    """What a histogram gained between two snapshots: ``count`` observations summing to ``sum``
    (the metric's unit, seconds here), and cumulative ``buckets`` as ``(upper bound, count)``."""

    count: int
    sum: float
    buckets: tuple[tuple[float, float], ...]

    @property
    def mean(self) -> float:
        """Exact mean (sum / count); NaN with no observations."""
        return self.sum / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """Quantile ``q`` in [0, 1], interpolated linearly inside its bucket (Prometheus' rule); an
        estimate whose error is bounded by the bucket's width. NaN with no observations."""
        require_real("q", q, 0.0, 1.0)
        if not self.count:
            return math.nan
        rank, lower, below = q * self.count, 0.0, 0.0
        for upper, cumulative in self.buckets:
            if cumulative >= rank and cumulative > below:
                if math.isinf(upper):
                    # beyond the last finite bound: that bound is all a histogram can say
                    return lower
                return lower + (upper - lower) * (rank - below) / (cumulative - below)
            lower, below = upper, cumulative
        return lower


def histogram_delta(
    before: MetricsSnapshot, after: MetricsSnapshot, name: str, **labels: str
) -> HistogramDelta:
    """The observations histogram ``name`` gained from ``before`` to ``after`` (series matching
    ``labels``)."""
    start, end = _buckets(before, name, labels), _buckets(after, name, labels)
    buckets = tuple((bound, end[bound] - start.get(bound, 0.0)) for bound in sorted(end))
    count = after.value(f"{name}_count", **labels) - before.value(f"{name}_count", **labels)
    total = after.value(f"{name}_sum", **labels) - before.value(f"{name}_sum", **labels)
    return HistogramDelta(int(round(count)), total, buckets)


def latency_ms(hist: HistogramDelta) -> dict[str, float]:
    """``requests`` (observations), ``mean_ms`` (exact) and ``p50_ms``/``p90_ms``
    (bucket-interpolated)."""
    return {
        "requests": hist.count,
        "mean_ms": 1000 * hist.mean,
        "p50_ms": 1000 * hist.quantile(0.5),
        "p90_ms": 1000 * hist.quantile(0.9),
    }


def server_latency_rows(before: MetricsSnapshot, after: MetricsSnapshot, prefix: str = "servelab",
                        **labels: str) -> list[dict]:
    """The server's own latencies over a run: one row per histogram of :data:`SERVER_LATENCIES` that
    gained observations between the two snapshots (``prefix`` is ``servelab`` for the course server,
    ``vllm`` for vLLM)."""
    rows = []
    for label, name in SERVER_LATENCIES:
        hist = histogram_delta(before, after, f"{prefix}:{name}", **labels)
        if hist.count:
            rows.append({"server": label, **latency_ms(hist)})
    return rows


def _buckets(snapshot: MetricsSnapshot, name: str, labels: dict[str, str]) -> dict[float, float]:
    """Cumulative bucket counts by upper bound, summed over the series matching ``labels``."""
    wanted, out = set(labels.items()), {}
    for (sample, sample_labels), value in snapshot.samples.items():
        others = dict(sample_labels)
        if sample == f"{name}_bucket" and wanted <= set(others.items()):
            bound = float(others.pop("le"))
            out[bound] = out.get(bound, 0.0) + value
    return out


async def run_with_metrics(run: Awaitable, url: str, interval_s: float = 0.5):
    """Await ``run`` (e.g. ``run_open_loop(...)``) while scraping ``url`` every ``interval_s``
    seconds.

    Returns ``(run's result, snapshots)``: the first snapshot is taken before the run starts, the
    last after it ends, so ``histogram_delta(snapshots[0], snapshots[-1], ...)`` covers exactly the
    run.
    """
    interval = require_real("interval_s", interval_s, 0.0, strict_min=True)
    async with aiohttp.ClientSession() as session:
        snapshots = [await scrape(session, url)]
        task = asyncio.ensure_future(run)
        while not task.done():
            await asyncio.wait([task], timeout=interval)
            if not task.done():
                snapshots.append(await scrape(session, url))
        result = task.result()
        snapshots.append(await scrape(session, url))
    return result, snapshots
