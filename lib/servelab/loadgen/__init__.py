"""A load generator for OpenAI-compatible streaming servers (ours, vLLM, SGLang).

Build a seeded workload (:mod:`~servelab.loadgen.workload`), drive it open-loop or closed-loop
(:mod:`~servelab.loadgen.client`), and report it honestly (:mod:`~servelab.loadgen.sweep`): latency
from the planned arrival, percentiles with their sample sizes, cold start apart from steady state,
SLO attainment and goodput, and a sweep to the saturation point; the server's own view comes from its
Prometheus ``/metrics``, scraped during a run (:mod:`~servelab.loadgen.scrape`). Command line:
``python -m servelab.loadgen --url http://127.0.0.1:8000/v1 --model NAME --rate R --duration S``.
"""

from servelab.loadgen.client import Endpoint, RequestResult, RunResult, run_closed_loop, run_open_loop, send_request
from servelab.loadgen.scrape import (HistogramDelta, MetricsSnapshot, histogram_delta, latency_ms, metrics_url,
                                     parse_metrics, run_with_metrics, scrape, server_latency_rows)
from servelab.loadgen.sweep import (SLO, LoadReport, PhaseSummary, SweepPoint, report_table, run_sweep,
                                    saturation_index, summarize, sweep_table, throughput_latency_figure)
from servelab.loadgen.workload import (LengthDistribution, RequestSpec, build_workload, make_prompt,
                                       paced_arrivals, poisson_arrivals)

__all__ = [
    "Endpoint", "HistogramDelta", "LengthDistribution", "LoadReport", "MetricsSnapshot", "PhaseSummary",
    "RequestResult", "RequestSpec", "RunResult", "SLO", "SweepPoint", "build_workload", "histogram_delta",
    "latency_ms", "make_prompt", "metrics_url", "paced_arrivals", "parse_metrics", "poisson_arrivals", "report_table",
    "run_closed_loop", "run_open_loop", "run_sweep", "run_with_metrics", "saturation_index", "scrape",
    "send_request", "server_latency_rows", "summarize", "sweep_table", "throughput_latency_figure",
]
