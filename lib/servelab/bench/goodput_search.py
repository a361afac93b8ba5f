"""DistServe's goodput: the highest request rate at which a server still meets an SLO-attainment
target, found by sweeping the offered rate through the simulated server.

The course uses two definitions, and both are in use in the field:

* goodput as a **rate of on-time work** (:func:`servelab.metrics.latency.goodput`): SLO-meeting
  requests finished per second at the load you measured;
* goodput as a **capacity** (DistServe): the largest arrival rate at which at least ``target`` of
  all requests meet every SLO. :func:`distserve_goodput` finds it: it runs
  :func:`servelab.metrics.loadsim.simulate_server` on :func:`servelab.metrics.loadsim.poisson_jobs`
  at each rate of a grid, once per seed, and then bisects between the last rate that met the target
  and the first that missed it.

System boundary: the simulated server of :mod:`servelab.metrics.loadsim` (simulated clock, exact and
repeatable). Attainment counts *every* request that arrived, each served to completion, so a late
request counts as a miss rather than leaving the population; a rate meets the target only when
every seed does (the worst seed decides). Rates in requests/s, SLOs in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servelab._validate import require_int, require_real
from servelab.metrics.loadsim import poisson_jobs, simulate_server
from servelab.metrics.latency import slo_attainment

__all__ = ["GoodputSearch", "attainment_at", "distserve_goodput"]


def attainment_at(rate: float, seed: int, duration_s: float, ttft_slo: float, tpot_slo: float,
                  **server: float) -> float:
    """SLO attainment (0..1) of every request of one seeded Poisson run at ``rate`` requests/s."""
    records = simulate_server(poisson_jobs(rate, duration_s, seed), **server)
    return slo_attainment(records, ttft_slo, tpot_slo) if records else 1.0


@dataclass(frozen=True)
class GoodputSearch:
    """The sweep behind one DistServe goodput.

    ``rates`` and ``worst_attainment`` are every rate simulated (grid and bisection, sorted) with
    the lowest attainment over the seeds; ``goodput`` is the highest rate whose every seed met
    ``target`` with every lower grid rate meeting it too (0 when even the lowest rate missed);
    ``first_miss`` is the lowest rate above it that missed (None when no rate missed).
    """

    target: float
    seeds: tuple[int, ...]
    rates: tuple[float, ...]
    worst_attainment: tuple[float, ...]
    goodput: float
    first_miss: float | None


def _worst(rate: float, seeds: Sequence[int], duration_s: float, slo: tuple[float, float],
           server: dict) -> float:
    return min(attainment_at(rate, s, duration_s, *slo, **server) for s in seeds)


def distserve_goodput(rates: Sequence[float], seeds: Sequence[int], duration_s: float,
                      ttft_slo: float, tpot_slo: float, target: float = 0.9,
                      bisect_steps: int = 4, **server: float) -> GoodputSearch:
    """Highest offered rate (requests/s) meeting ``target`` attainment, from a grid then bisection.

    ``rates``: the grid, increasing; ``bisect_steps`` halvings of the interval between the last
    grid rate that met the target and the first that missed; ``server``: keyword arguments of
    :func:`servelab.metrics.loadsim.simulate_server`.
    """
    if not isinstance(rates, Sequence) or not rates:
        raise ValueError("rates must be a non-empty increasing list of request rates (requests/s)")
    grid = [require_real("rates[i]", r, 0, strict_min=True) for r in rates]
    if any(b <= a for a, b in zip(grid, grid[1:])):
        raise ValueError("rates must be strictly increasing")
    if not isinstance(seeds, Sequence) or not seeds:
        raise ValueError("seeds must be a non-empty list of ints >= 0")
    seeds = tuple(require_int("seeds[i]", s, 0) for s in seeds)
    target = require_real("target", target, 0, 1, strict_min=True)
    steps = require_int("bisect_steps", bisect_steps, 0)
    slo = (require_real("ttft_slo", ttft_slo, 0, strict_min=True),
           require_real("tpot_slo", tpot_slo, 0, strict_min=True))
    seen: dict[float, float] = {}
    good, miss = 0.0, None
    for rate in grid:
        seen[rate] = _worst(rate, seeds, duration_s, slo, server)
        if seen[rate] < target:
            miss = rate
            break
        good = rate
    if miss is not None and good > 0:
        for _ in range(steps):
            mid = (good + miss) / 2
            seen[mid] = _worst(mid, seeds, duration_s, slo, server)
            good, miss = (mid, miss) if seen[mid] >= target else (good, mid)
    ordered = sorted(seen)
    return GoodputSearch(target, seeds, tuple(ordered), tuple(seen[r] for r in ordered), good, miss)
