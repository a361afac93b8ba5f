"""A load generator for OpenAI-compatible streaming servers (ours, vLLM, SGLang).

Build a seeded workload (:mod:`~servelab.loadgen.workload`), drive it open-loop or closed-loop
(:mod:`~servelab.loadgen.client`), and report it honestly (:mod:`~servelab.loadgen.sweep`): latency
from the planned arrival, percentiles with their sample sizes, cold start apart from steady state,
SLO attainment and goodput, and a sweep to the saturation point. Command line:
``python -m servelab.loadgen --url http://127.0.0.1:8000/v1 --model NAME --rate R --duration S``.
"""

from servelab.loadgen.client import Endpoint, RequestResult, RunResult, run_closed_loop, run_open_loop, send_request
from servelab.loadgen.sweep import (SLO, LoadReport, PhaseSummary, SweepPoint, report_table, run_sweep,
                                    saturation_index, summarize, sweep_table, throughput_latency_figure)
from servelab.loadgen.workload import (LengthDistribution, RequestSpec, build_workload, make_prompt,
                                       paced_arrivals, poisson_arrivals)

__all__ = [
    "Endpoint", "LengthDistribution", "LoadReport", "PhaseSummary", "RequestResult", "RequestSpec",
    "RunResult", "SLO", "SweepPoint", "build_workload", "make_prompt", "paced_arrivals", "poisson_arrivals",
    "report_table", "run_closed_loop", "run_open_loop", "run_sweep", "saturation_index", "send_request",
    "summarize", "sweep_table", "throughput_latency_figure",
]
