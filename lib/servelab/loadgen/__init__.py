"""A load generator for OpenAI-compatible streaming servers (ours, vLLM, SGLang).

Build a seeded workload (:mod:`~servelab.loadgen.workload`), drive it open-loop or closed-loop
(:mod:`~servelab.loadgen.client`), and report it honestly (:mod:`~servelab.loadgen.sweep`): latency
from the planned arrival, percentiles with their sample sizes, cold start apart from steady state,
SLO attainment and goodput, and a sweep to the saturation point; the server's own view comes from
its Prometheus ``/metrics``, scraped during a run (:mod:`~servelab.loadgen.scrape`). It also speaks
``vllm bench serve``: gamma arrivals (:func:`~servelab.loadgen.workload.gamma_arrivals`), its
datasets (:mod:`~servelab.loadgen.datasets`) and its result JSON
(:mod:`~servelab.loadgen.bench_result`). Command line: ``python -m servelab.loadgen --url
http://127.0.0.1:8000/v1 --model NAME --rate R --duration S`` (the course's flags) or ``...
--base-url http://127.0.0.1:8000 --request-rate R --num-prompts N`` (vLLM's).
"""

from servelab.loadgen.bench_result import bench_records, bench_summary, percentile_key
from servelab.loadgen.client import (
    Endpoint,
    RequestResult,
    RunResult,
    run_closed_loop,
    run_open_loop,
    send_request,
)
from servelab.loadgen.datasets import (
    Sample,
    custom_samples,
    load_samples,
    random_samples,
    sharegpt_samples,
    specs_from_samples,
)
from servelab.loadgen.scrape import (
    HistogramDelta,
    MetricsSnapshot,
    histogram_delta,
    latency_ms,
    metrics_url,
    parse_metrics,
    run_with_metrics,
    scrape,
    server_latency_rows,
)
from servelab.loadgen.sweep import (
    SLO,
    LoadReport,
    PhaseSummary,
    SweepPoint,
    report_table,
    run_sweep,
    saturation_index,
    summarize,
    sweep_table,
    throughput_latency_figure,
)
from servelab.loadgen.workload import (
    LengthDistribution,
    RequestSpec,
    build_workload,
    gamma_arrivals,
    make_prompt,
    paced_arrivals,
    poisson_arrivals,
)

__all__ = [
    "Sample",
    "bench_records",
    "bench_summary",
    "custom_samples",
    "gamma_arrivals",
    "load_samples",
    "percentile_key",
    "random_samples",
    "sharegpt_samples",
    "specs_from_samples",
    "Endpoint",
    "HistogramDelta",
    "LengthDistribution",
    "LoadReport",
    "MetricsSnapshot",
    "PhaseSummary",
    "RequestResult",
    "RequestSpec",
    "RunResult",
    "SLO",
    "SweepPoint",
    "build_workload",
    "histogram_delta",
    "latency_ms",
    "make_prompt",
    "metrics_url",
    "paced_arrivals",
    "parse_metrics",
    "poisson_arrivals",
    "report_table",
    "run_closed_loop",
    "run_open_loop",
    "run_sweep",
    "run_with_metrics",
    "saturation_index",
    "scrape",
    "send_request",
    "server_latency_rows",
    "summarize",
    "sweep_table",
    "throughput_latency_figure",
]
