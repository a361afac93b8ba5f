"""Simulated servers for load experiments: a load sweep and a coordinated-omission demonstration.

System boundary: a cost model of a server, not the engine. Time is simulated (seconds from the start
of the run, no wall clock), so every result is exact and repeatable. Two experiments:

* **Load sweep.** :func:`poisson_jobs` draws seeded Poisson arrivals with random prompt and output
  lengths; :func:`simulate_server` serves them with continuous batching (FCFS, a fixed number of
  slots, one iteration costs a fixed overhead plus a cost per processed token) and returns one
  :class:`servelab.metrics.latency.RequestTiming` per request, so throughput, SLO attainment and
  goodput all come from :mod:`servelab.metrics.latency`. :func:`load_sweep` repeats that for several
  seeds per rate and keeps one :class:`servelab.metrics.latency.WindowReport` per run.
* **Coordinated omission.** :func:`run_benchmark` sends planned requests to a FIFO single-worker
  server that makes no progress during a stall (:func:`finish_time`), closed-loop or open-loop, and
  returns send and finish times. Latency measured from the actual send (closed loop) hides the
  stall; measured from the planned send it does not.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from servelab._validate import require_int, require_real
from servelab.metrics.latency import (
    Band,
    RequestTiming,
    WindowReport,
    band,
    percentile,
    window_report,
)

__all__ = ["Job", "SweepPoint", "finish_time", "load_sweep", "poisson_jobs", "run_benchmark",
           "simulate_server"]


@dataclass(frozen=True)
class Job:
    """One simulated request: arrival time (s) and its prompt and output lengths (tokens, >= 1)."""

    arrival: float
    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        require_real("arrival", self.arrival, 0.0)
        require_int("prompt_tokens", self.prompt_tokens, 1)
        require_int("output_tokens", self.output_tokens, 1)


# --- load sweep -----------------------------------------------------------------------------------


def poisson_jobs(rate: float, duration: float, seed: int = 0) -> list[Job]:
    """Poisson arrivals at ``rate`` requests/s over ``[0, duration)`` s, sorted by arrival.

    Prompt lengths are uniform in [32, 512) tokens and output lengths in [16, 256), all drawn from
    ``numpy.random.default_rng(seed)``, so one seed gives one workload.
    """
    rate = require_real("rate", rate, 0.0, strict_min=True)
    duration = require_real("duration", duration, 0.0, strict_min=True)
    seed = require_int("seed", seed, 0)
    rng = np.random.default_rng(seed)
    # 1.5x the expected count (+20) makes running out of gaps before ``duration`` vanishingly rare
    arrivals = np.cumsum(rng.exponential(1 / rate, size=int(rate * duration * 1.5) + 20))
    arrivals = arrivals[arrivals < duration]
    prompts = rng.integers(32, 512, size=arrivals.size)
    outputs = rng.integers(16, 256, size=arrivals.size)
    return [Job(float(a), int(p), int(o)) for a, p, o in zip(arrivals, prompts, outputs)]


def _check_jobs(jobs: object) -> list[Job]:
    if not isinstance(jobs, (list, tuple)) or not all(isinstance(j, Job) for j in jobs):
        raise TypeError("jobs must be a list or tuple of Job")
    if any(b.arrival < a.arrival for a, b in zip(jobs, jobs[1:])):
        raise ValueError("jobs must be sorted by arrival")
    return list(jobs)


def simulate_server(jobs: list[Job], max_batch: int = 16, overhead_s: float = 0.010,
                    per_token_s: float = 0.0002) -> list[RequestTiming]:
    """Serve ``jobs`` with continuous batching, FCFS; one RequestTiming per job, in finishing order.

    Each iteration admits arrived jobs into free slots (at most ``max_batch`` running); an admitted
    job's prefill runs in that iteration and emits its first token, and every running job emits one
    token. An iteration lasts ``overhead_s + per_token_s * tokens`` seconds, where ``tokens`` is one
    per running job plus the admitted prompts. A job's ``first_scheduled`` is the start of the
    iteration that admitted it; its ``finish`` is its last emit.
    """
    waiting = deque(_check_jobs(jobs))
    max_batch = require_int("max_batch", max_batch, 1)
    overhead_s = require_real("overhead_s", overhead_s, 0.0, strict_min=True)
    per_token_s = require_real("per_token_s", per_token_s, 0.0)
    running: list[tuple[Job, float, list[float]]] = []
    done: list[RequestTiming] = []
    clock = 0.0
    while waiting or running:
        if not running and waiting[0].arrival > clock:
            clock = waiting[0].arrival  # idle until the next arrival
        admitted = []
        while waiting and waiting[0].arrival <= clock and len(running) + len(admitted) < max_batch:
            admitted.append((waiting.popleft(), clock, []))
        tokens = len(running) + sum(job.prompt_tokens for job, _, _ in admitted)
        clock += overhead_s + per_token_s * tokens
        running += admitted
        for _, _, emits in running:
            emits.append(clock)
        finished = [r for r in running if len(r[2]) == r[0].output_tokens]
        running = [r for r in running if len(r[2]) < r[0].output_tokens]
        done += [RequestTiming(job.arrival, start, tuple(emits), emits[-1], job.prompt_tokens)
                 for job, start, emits in finished]
    return done


SWEEP_QUANTITIES = (
    "completion_rate",
    "output_tokens_per_s",
    "attainment",
    "goodput",
    "open_at_close",
    "p90_ttft_s",
)


@dataclass(frozen=True)
class SweepPoint:
    """One offered rate of a load sweep: one run per seed, each a WindowReport over its window.

    ``p90_ttft_s`` holds each run's 90th-percentile TTFT (s) over the same population as its report
    (the requests finished inside the window).
    """

    rate: float
    seeds: tuple[int, ...]
    reports: tuple[WindowReport, ...]
    p90_ttft_s: tuple[float, ...]

    def band(self, quantity: str) -> Band:
        """Mean and min-max over the seeds of a quantity named in ``SWEEP_QUANTITIES``."""
        if quantity not in SWEEP_QUANTITIES:
            raise ValueError(f"quantity must be one of {SWEEP_QUANTITIES}, got {quantity!r}")
        if quantity == "p90_ttft_s":
            return band(list(self.p90_ttft_s))
        return band([float(getattr(r, quantity)) for r in self.reports])


def _sweep_run(rate: float, seed: int, duration_s: float, slo: tuple[float, float],
               server: dict) -> tuple[WindowReport, float]:
    records = simulate_server(poisson_jobs(rate, duration_s, seed), **server)
    report = window_report(records, *slo, (0.0, duration_s))
    finished = [r.ttft for r in records if r.finish <= duration_s] or [0.0]
    return report, percentile(finished, 90).value


def load_sweep(rates: list[float], seeds: list[int], duration_s: float, ttft_slo: float,
               tpot_slo: float, **server: float) -> list[SweepPoint]:
    """Simulate every offered rate (requests/s) once per seed for ``duration_s`` seconds.

    Each run feeds :func:`poisson_jobs` (rate, duration, seed) to :func:`simulate_server`
    (``server`` holds its keyword arguments) and counts the requests finished inside
    ``[0, duration_s]`` against the SLOs (TTFT <= ``ttft_slo`` s, TPOT <= ``tpot_slo`` s/token).
    """
    if not isinstance(rates, (list, tuple)) or not rates:
        raise ValueError("rates must be a non-empty list of offered rates (requests/s)")
    if not isinstance(seeds, (list, tuple)) or not seeds:
        raise ValueError("seeds must be a non-empty list of ints >= 0")
    seeds = [require_int("seeds[i]", s, 0) for s in seeds]
    slo = (require_real("ttft_slo", ttft_slo, 0.0), require_real("tpot_slo", tpot_slo, 0.0))
    points = []
    for rate in rates:
        runs = [_sweep_run(rate, s, duration_s, slo, server) for s in seeds]
        points.append(SweepPoint(rate, tuple(seeds), tuple(r for r, _ in runs),
                                 tuple(p for _, p in runs)))
    return points


# --- coordinated omission -------------------------------------------------------------------------


def _check_stall(stall: object) -> tuple[float, float]:
    if not isinstance(stall, tuple) or len(stall) != 2:
        raise TypeError("stall must be a (start, end) tuple of seconds")
    start = require_real("stall start", stall[0])
    end = require_real("stall end", stall[1])
    if end < start:
        raise ValueError(f"stall must satisfy start <= end, got {stall}")
    return start, end


def finish_time(start: float, service_s: float, stall: tuple[float, float]) -> float:
    """When ``service_s`` seconds of work started at ``start`` ends, if the server makes no progress
    during the ``stall`` interval ``(start, end)`` (all in seconds)."""
    start = require_real("start", start)
    service_s = require_real("service_s", service_s, 0.0, strict_min=True)
    stall_start, stall_end = _check_stall(stall)
    end = start + service_s
    if start < stall_end and end > stall_start:
        end += stall_end - max(start, stall_start)
    return end


def run_benchmark(planned: np.ndarray, service_s: float, stall: tuple[float, float],
                  closed_loop: bool) -> tuple[np.ndarray, np.ndarray]:
    """Send times and finish times (s) of every planned request on a FIFO single-worker server.

    ``planned`` holds the planned send times, non-decreasing. Closed loop: a request is sent when
    planned or when the previous one returns, whichever is later. Open loop: sent exactly when
    planned; it queues behind unfinished work. Latency is ``finish - send`` as a naive closed-loop
    client measures it, ``finish - planned`` as it should be measured.
    """
    times = np.asarray(planned, dtype=float)
    if times.ndim != 1 or times.size == 0 or not np.all(np.isfinite(times)):
        raise ValueError("planned must be a non-empty 1-D array of finite send times")
    if np.any(np.diff(times) < 0):
        raise ValueError("planned must be sorted (non-decreasing)")
    if not isinstance(closed_loop, bool):
        raise TypeError(f"closed_loop must be a bool, got {type(closed_loop).__name__}")
    sends, finishes, busy_until = [], [], 0.0
    for t in times:
        send = max(t, busy_until) if closed_loop else t
        done = finish_time(max(send, busy_until), service_s, stall)
        sends.append(send)
        finishes.append(done)
        busy_until = done
    return np.array(sends), np.array(finishes)
