"""Back-of-the-envelope capacity, cost and speculative-decoding arithmetic.

Every worked number in the book comes out of a function here, and every assumption is an argument:
change the argument, and the chapter's number changes with it. Units are in each name: bytes
(decimal GB = 1e9 bytes, binary GiB = 2**30 bytes, use ``to_gb`` / ``to_gib``), FLOPs, seconds,
milliseconds, requests/s, US dollars per month.

Capacity planning reads in four steps: Little's law turns a rate and a time in system into a count
in flight (:func:`requests_in_flight`); a per-replica ceiling measured on a load sweep
(:func:`sustained_rate`) gives the replica count (:func:`replicas_needed`) and its
:func:`headroom`; the distribution of the count in flight (:func:`in_flight_quantile`, checked
against a simulated run with :func:`occupancy`) sizes the KV reservations; the cost functions turn
replicas into dollars per 1,000 requests.

System boundary: raw payload estimates for one deployment. Weight bytes exclude quantisation scales
and runtime workspaces; KV bytes are the ideal cache payload (see ``servelab.kv``); replica counts
come from a measured per-replica rate, not from a model of the hardware. The default rates of the
cost comparison are the design exercise's editable interview assumptions, not vendor quotes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab._validate import require_int, require_real
from servelab.kv import kv_bytes_per_token
from servelab.metrics.roofline.analytic import causal_attention_flops

__all__ = [
    "GB", "GIB", "to_gb", "to_gib", "weight_bytes", "kv_bytes_for_tokens", "kv_bytes_per_request",
    "flops_per_token", "compute_rate", "prefill_flops", "time_to_last_token", "weight_read_rate",
    "peak_arrival_rate", "requests_in_flight", "in_flight_quantile", "in_flight_exceedance",
    "Occupancy", "occupancy", "sustained_rate", "headroom", "ReplicaPlan", "replicas_needed",
    "CostBreakdown", "monthly_requests", "operating_allowances", "hosted_cost", "owned_cost",
    "speculative_time_per_token", "speculative_speedup", "expected_tokens_per_cycle",
    "breakeven_acceptance",
]

GB = 10**9
GIB = 2**30
SECONDS_PER_HOUR = 3600
MILLION = 10**6


def _fraction(name: str, value: object) -> float:
    require_real(name, value, 0)
    if value > 1:
        raise ValueError(f"{name} must satisfy 0 <= {name} <= 1, got {value}")
    return value


def to_gb(n_bytes: float) -> float:
    """Bytes -> decimal gigabytes (1 GB = 1e9 bytes)."""
    return require_real("n_bytes", n_bytes, 0) / GB


def to_gib(n_bytes: float) -> float:
    """Bytes -> binary gibibytes (1 GiB = 2**30 bytes)."""
    return require_real("n_bytes", n_bytes, 0) / GIB


# --- memory ---------------------------------------------------------------------------------------


def weight_bytes(params: float, bytes_per_param: float) -> float:
    """Raw weight storage in bytes: params x bytes per parameter (0.5 for packed int4)."""
    return require_real("params", params, 0, strict_min=True) * require_real(
        "bytes_per_param", bytes_per_param, 0, strict_min=True
    )


def kv_bytes_for_tokens(
    n_tokens: int,
    n_layers: int,
    n_kv_heads: int,
    head_dim: int,
    bytes_per_elem: int,
    n_requests: int = 1,
) -> int:
    """Raw KV-cache bytes for ``n_requests`` sequences of ``n_tokens`` cached tokens each.

    Per token 2 x layers x KV heads x head dim x bytes (``servelab.kv.kv_bytes_per_token``); use the
    KV head count, not the query head count, for grouped-query attention.
    """
    require_int("n_tokens", n_tokens, 0)
    require_int("n_requests", n_requests, 1)
    return (
        n_requests * n_tokens * kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem)
    )


def kv_bytes_per_request(
    prompt_tokens: int, reserved_output_tokens: int, n_layers: int, n_kv_heads: int, head_dim: int,
    bytes_per_elem: int,
) -> int:
    """KV bytes an admission controller must reserve for one request at its maximum length.

    The reservation covers the whole prompt plus the output allowance, since decode grows the cache.
    """
    require_int("prompt_tokens", prompt_tokens, 0)
    require_int("reserved_output_tokens", reserved_output_tokens, 0)
    return kv_bytes_for_tokens(
        prompt_tokens + reserved_output_tokens, n_layers, n_kv_heads, head_dim, bytes_per_elem
    )


# --- compute and latency --------------------------------------------------------------------------


def flops_per_token(params: float) -> float:
    """Dense weight-matmul FLOPs per token, 2 x params (attention over the context is extra)."""
    return 2 * require_real("params", params, 0, strict_min=True)


def compute_rate(params: float, tokens_per_second: float) -> float:
    """FLOP/s needed by the weight matmuls to produce ``tokens_per_second`` tokens."""
    return flops_per_token(params) * require_real(
        "tokens_per_second", tokens_per_second, 0, strict_min=True
    )


def prefill_flops(
    params: float, seq_len: int, n_layers: int, n_heads: int, head_dim: int
) -> tuple[float, float]:
    """(weight-matmul FLOPs, attention FLOPs) of one dense prefill of ``seq_len`` tokens.

    Weights: 2 x params per token, linear in the prompt. Attention: causal, counted as the roofline
    counts it (:func:`servelab.metrics.roofline.causal_attention_flops`, with ``hidden = n_heads x
    head_dim``): each token scores itself and every earlier one, 2 x 2 x head_dim per (query, key)
    pair per query head per layer, quadratic in the prompt.
    """
    n = require_int("seq_len", seq_len, 1)
    hidden = require_int("n_heads", n_heads, 1) * require_int("head_dim", head_dim, 1)
    return flops_per_token(params) * n, float(causal_attention_flops(n_layers, hidden, n))


def weight_read_rate(params: float, bytes_per_param: float, tokens_per_second: float) -> float:
    """Bytes/s of weight reads for one sequence decoding ``tokens_per_second`` tokens (batch 1).

    Every decode step reads every weight once, so a lone stream needs weight bytes x tokens/s of
    memory bandwidth, whatever its FLOPs; a batch shares each read among its sequences.
    """
    return weight_bytes(params, bytes_per_param) * require_real(
        "tokens_per_second", tokens_per_second, 0, strict_min=True
    )


def time_to_last_token(ttft: float, n_tokens: int, tokens_per_second: float) -> float:
    """Seconds until the last of ``n_tokens`` arrives: TTFT + (n - 1) / decode rate.

    The first token is already inside TTFT; ``tokens_per_second`` is the rate after it.
    """
    require_real("ttft", ttft, 0)
    require_int("n_tokens", n_tokens, 1)
    return ttft + (n_tokens - 1) / require_real(
        "tokens_per_second", tokens_per_second, 0, strict_min=True
    )


# --- replicas -------------------------------------------------------------------------------------


def peak_arrival_rate(
    requests_per_day: float, active_hours: float, peak_factor: float, retry_allowance: float
) -> float:
    """Peak attempts per second: daily requests spread over the active hours, times the peak factor,
    times (1 + retry allowance) for additional attempts (0.05 = 5 % extra)."""
    require_real("requests_per_day", requests_per_day, 0, strict_min=True)
    hours = require_real("active_hours", active_hours, 0, strict_min=True)
    if hours > 24:
        raise ValueError(f"active_hours must be <= 24, got {active_hours}")
    require_real("peak_factor", peak_factor, 0, strict_min=True)
    require_real("retry_allowance", retry_allowance, 0)
    mean_rate = requests_per_day / (hours * SECONDS_PER_HOUR)
    return mean_rate * peak_factor * (1 + retry_allowance)


def requests_in_flight(arrival_rate: float, service_time_s: float) -> float:
    """Mean requests in service at once, by Little's law: arrival rate (req/s) x mean service time
    (s).

    Holds for any arrival pattern and service-time distribution in steady state; it is a mean, and
    the count in flight fluctuates around it (see :func:`in_flight_quantile`).
    """
    rate = require_real("arrival_rate", arrival_rate, 0, strict_min=True)
    return rate * require_real("service_time_s", service_time_s, 0, strict_min=True)


def in_flight_quantile(mean_in_flight: float, quantile: float) -> int:
    """Smallest n with P(requests in flight <= n) >= ``quantile`` when arrivals are Poisson.

    With Poisson arrivals and any service-time distribution the number in service is Poisson with
    mean ``mean_in_flight`` (the M/G/infinity result); capacity for n requests then turns requests
    away (or queues them) less than 1 - ``quantile`` of the time.
    """
    mean = require_real("mean_in_flight", mean_in_flight, 0, strict_min=True)
    q = require_real("quantile", quantile, 0, 1, strict_min=True, strict_max=True)
    n, log_pmf = 0, -mean
    cdf = math.exp(log_pmf)
    while cdf < q:
        n += 1
        log_pmf += math.log(mean) - math.log(n)
        cdf += math.exp(log_pmf)
    return n


def in_flight_exceedance(mean_in_flight: float, n: int) -> float:
    """P(requests in flight > n) for Poisson arrivals (the count is Poisson with mean
    ``mean_in_flight``): the share of time capacity for ``n`` requests is not enough."""
    mean = require_real("mean_in_flight", mean_in_flight, 0, strict_min=True)
    n = require_int("n", n, 0)
    log_pmf, cdf = -mean, math.exp(-mean)
    for k in range(1, n + 1):
        log_pmf += math.log(mean) - math.log(k)
        cdf += math.exp(log_pmf)
    return max(0.0, 1.0 - cdf)


@dataclass(frozen=True)
class Occupancy:
    """How many requests were in the system, weighted by time, over a window of ``duration_s`` s.

    ``seconds_at[n]`` is the time (s) during which exactly ``n`` requests were in the system.
    """

    seconds_at: dict[int, float]
    duration_s: float

    @property
    def mean(self) -> float:
        """Time-average count in the system (the L of Little's law)."""
        return sum(n * t for n, t in self.seconds_at.items()) / self.duration_s

    def quantile(self, q: float) -> int:
        """Smallest n with the count at or below n for at least a share ``q`` of the time."""
        q = require_real("q", q, 0, 1, strict_min=True)
        covered = 0.0
        for n in sorted(self.seconds_at):
            covered += self.seconds_at[n]
            if covered >= q * self.duration_s * (1 - 1e-12):
                return n
        return max(self.seconds_at)

    def share_above(self, n: int) -> float:
        """Share of the time more than ``n`` requests were in the system."""
        require_int("n", n, 0)
        return sum(t for k, t in self.seconds_at.items() if k > n) / self.duration_s


def occupancy(intervals: list[tuple[float, float]], start: float, end: float) -> Occupancy:
    """Time-weighted count in the system over ``[start, end)`` s, from (arrival, finish) pairs in s.

    A request counts from its arrival to its finish, queueing included; parts outside the window
    are cut off, so a window that starts after a warm-up measures the steady state.
    """
    start, end = require_real("start", start), require_real("end", end)
    if end <= start:
        raise ValueError(f"end must be after start, got [{start}, {end})")
    events = []
    for arrival, finish in intervals:
        if finish < arrival:
            raise ValueError(f"finish {finish} is before arrival {arrival}")
        lo, hi = max(arrival, start), min(finish, end)
        if lo < hi:
            events += [(lo, 1), (hi, -1)]
    events.sort()
    seconds_at: dict[int, float] = {}
    count, clock = 0, start
    for time, step in events + [(end, 0)]:
        if time > clock:
            seconds_at[count] = seconds_at.get(count, 0.0) + time - clock
        count, clock = count + step, time
    return Occupancy(seconds_at, end - start)


def sustained_rate(rates: list[float], attainments: list[float], target: float) -> float:
    """Highest offered rate (req/s) at which it and every lower rate of a sweep meet ``target``.

    ``attainments`` are the SLO-attainment fractions measured at ``rates`` (one each); this is the
    per-replica ceiling a plan divides by. The lowest rate must meet the target.
    """
    target = _fraction("target", target)
    if not rates or len(rates) != len(attainments):
        raise ValueError("rates and attainments must be non-empty lists of the same length")
    pairs = sorted(zip(rates, attainments))
    if pairs[0][1] < target:
        raise ValueError(f"even the lowest rate {pairs[0][0]} misses the target {target}")
    best = pairs[0][0]
    for rate, attained in pairs:
        if attained < target:
            break
        best = rate
    return best


def headroom(arrival_rate: float, serving: int, ceiling_rate: float) -> float:
    """Share of the serving replicas' ceiling left unused at ``arrival_rate`` (req/s):
    1 - arrival / (serving x ceiling). Negative means the replicas are past their ceiling."""
    rate = require_real("arrival_rate", arrival_rate, 0)
    n = require_int("serving", serving, 1)
    return 1 - rate / (n * require_real("ceiling_rate", ceiling_rate, 0, strict_min=True))


@dataclass(frozen=True)
class ReplicaPlan:
    """Replica count: ``serving`` carries the peak at the planning utilisation, ``spare`` survives
    failures; ``budget_per_replica`` is the requests/s each serving replica is planned to take."""

    budget_per_replica: float
    serving: int
    spare: int

    @property
    def total(self) -> int:
        return self.serving + self.spare


def replicas_needed(
    arrival_rate: float, per_replica_rate: float, planning_utilization: float, spare: int = 1
) -> ReplicaPlan:
    """ceil(arrival / (per-replica rate x planning utilisation)) serving replicas, plus ``spare``.

    ``per_replica_rate`` is the measured rate one complete replica sustains within the latency SLO
    for this request mix; ``planning_utilization`` in (0, 1] is headroom, not a latency guarantee.
    """
    require_real("arrival_rate", arrival_rate, 0, strict_min=True)
    require_real("per_replica_rate", per_replica_rate, 0, strict_min=True)
    if not 0 < _fraction("planning_utilization", planning_utilization):
        raise ValueError("planning_utilization must satisfy 0 < planning_utilization <= 1")
    require_int("spare", spare, 0)
    budget = per_replica_rate * planning_utilization
    # the 1e-12 keeps an exact multiple (e.g. 5.6 / 2.8) from rounding up through float error
    return ReplicaPlan(budget, math.ceil(arrival_rate / budget - 1e-12), spare)


# --- cost -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostBreakdown:
    """Monthly cost (US$) in two parts and the per-1,000 figures derived from them.

    ``usage_items`` scale with the traffic or the hardware bought (tokens billed, replica hours);
    ``fixed_items`` are the operating costs either option pays whatever the traffic.
    """

    usage_items: dict[str, float]
    fixed_items: dict[str, float]
    original_requests: float
    useful_fraction: float

    @property
    def line_items(self) -> dict[str, float]:
        """Every line item, usage first."""
        return {**self.usage_items, **self.fixed_items}

    @property
    def usage_total(self) -> float:
        return sum(self.usage_items.values())

    @property
    def fixed_total(self) -> float:
        return sum(self.fixed_items.values())

    @property
    def total(self) -> float:
        return self.usage_total + self.fixed_total

    def per_1000(self, amount: float) -> float:
        """``amount`` (US$/month) per 1,000 original requests."""
        return 1000 * amount / self.original_requests

    @property
    def per_1000_requests(self) -> float:
        return self.per_1000(self.total)

    @property
    def per_1000_useful(self) -> float:
        return self.per_1000_requests / self.useful_fraction


def monthly_requests(requests_per_day: float = 100_000, days: int = 30) -> float:
    """Original requests per month (retries not included)."""
    return require_real("requests_per_day", requests_per_day, 0, strict_min=True) * require_int(
        "days", days, 1
    )


def operating_allowances(
    application: float = 600.0, maintenance: float = 1_500.0, review_hours: float = 500.0,
    review_rate: float = 35.0,
) -> dict[str, float]:
    """Fixed monthly costs either option pays: application, maintenance, quality review (hours x
    $/h)."""
    return {
        "application": require_real("application", application, 0),
        "maintenance": require_real("maintenance", maintenance, 0),
        "quality review": require_real("review_hours", review_hours, 0)
        * require_real("review_rate", review_rate, 0),
    }


def hosted_cost(
    requests_per_month: float = 3_000_000,
    attempt_factor: float = 1.05,
    input_tokens: float = 2_000,
    output_tokens: float = 250,
    input_price_per_m: float = 0.50,
    cached_input_price_per_m: float = 0.05,
    cached_input_share: float = 0.30,
    output_price_per_m: float = 2.00,
    useful_fraction: float = 0.97,
    allowances: dict[str, float] | None = None,
) -> CostBreakdown:
    """Monthly cost of a hosted token API (US$), billed on every attempt.

    Token counts are means per attempt; prices are $ per million tokens; ``cached_input_share`` of
    input tokens bills at the cached rate. The token bill is the usage part; ``allowances`` (the
    fixed part) defaults to ``operating_allowances()``.
    """
    require_real("requests_per_month", requests_per_month, 0, strict_min=True)
    attempts = requests_per_month * require_real(
        "attempt_factor", attempt_factor, 0, strict_min=True
    )
    share = _fraction("cached_input_share", cached_input_share)
    fed = attempts * require_real("input_tokens", input_tokens, 0) / MILLION
    out = attempts * require_real("output_tokens", output_tokens, 0) / MILLION
    input_price = require_real("input_price_per_m", input_price_per_m, 0)
    cached_price = require_real("cached_input_price_per_m", cached_input_price_per_m, 0)
    output_price = require_real("output_price_per_m", output_price_per_m, 0)
    items = {
        "uncached input tokens": fed * (1 - share) * input_price,
        "cached input tokens": fed * share * cached_price,
        "output tokens": out * output_price,
    }
    fixed = operating_allowances() if allowances is None else _allowances(allowances)
    return CostBreakdown(items, fixed, requests_per_month, _useful(useful_fraction))


def owned_cost(
    replicas: int = 7,
    hourly_rate: float = 6.0,
    hours_per_month: float = 720,
    requests_per_month: float = 3_000_000,
    useful_fraction: float = 0.97,
    allowances: dict[str, float] | None = None,
) -> CostBreakdown:
    """Monthly cost of owned replicas (US$): replica hours billed every hour, idle or not (the usage
    part), and the same fixed ``allowances`` as :func:`hosted_cost`.

    No per-token charge: inference on owned replicas is paid for by the hours.
    """
    require_int("replicas", replicas, 1)
    hours = require_real("hours_per_month", hours_per_month, 0, strict_min=True)
    items = {
        "replica hours": replicas
        * require_real("hourly_rate", hourly_rate, 0, strict_min=True)
        * hours
    }
    fixed = operating_allowances() if allowances is None else _allowances(allowances)
    per_month = require_real("requests_per_month", requests_per_month, 0, strict_min=True)
    return CostBreakdown(items, fixed, per_month, _useful(useful_fraction))


def _allowances(allowances: object) -> dict[str, float]:
    if not isinstance(allowances, dict):
        raise TypeError("allowances must be a dict of line item -> monthly US$")
    return {str(k): require_real(f"allowances[{k!r}]", v, 0) for k, v in allowances.items()}


def _useful(useful_fraction: object) -> float:
    if not 0 < _fraction("useful_fraction", useful_fraction):
        raise ValueError("useful_fraction must satisfy 0 < useful_fraction <= 1")
    return useful_fraction


# --- speculative decoding -------------------------------------------------------------------------


def speculative_time_per_token(draft_ms: float, verify_ms: float, tokens_advanced: float) -> float:
    """Milliseconds per advanced token: (draft + verify/correct time of one cycle) / tokens
    advanced."""
    cycle = require_real("draft_ms", draft_ms, 0) + require_real(
        "verify_ms", verify_ms, 0, strict_min=True
    )
    return cycle / require_real("tokens_advanced", tokens_advanced, 0, strict_min=True)


def speculative_speedup(
    baseline_ms_per_token: float, draft_ms: float, verify_ms: float, tokens_advanced: float
) -> float:
    """Baseline ms/token over speculative ms/token; below 1 means speculation is slower."""
    baseline = require_real("baseline_ms_per_token", baseline_ms_per_token, 0, strict_min=True)
    return baseline / speculative_time_per_token(draft_ms, verify_ms, tokens_advanced)


def expected_tokens_per_cycle(acceptance_rate: float, draft_len: int) -> float:
    """Expected tokens advanced per cycle, (1 - a^(k+1)) / (1 - a), for i.i.d. acceptance a of k
    drafted tokens (the target always contributes one token; a = 1 gives k + 1)."""
    a = _fraction("acceptance_rate", acceptance_rate)
    k = require_int("draft_len", draft_len, 0)
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def breakeven_acceptance(cycle_cost: float, draft_len: int, tol: float = 1e-12) -> float:
    """The acceptance rate at which speculation exactly breaks even with plain decoding.

    A cycle drafts ``draft_len`` tokens and verifies them in one target forward pass; ``cycle_cost``
    is what the whole cycle costs (``draft_len`` draft steps plus the verify pass) in units of one
    plain single-token target step, so plain decoding buys 1 token per unit. The cycle buys
    :func:`expected_tokens_per_cycle` tokens, which assumes every drafted token is accepted
    independently with the same probability ``a``. Returns the ``a`` in ``[0, 1]`` where the two are
    equal, i.e. where :func:`speculative_speedup` is exactly 1 (found by bisection, to within
    ``tol``): above it speculation is faster, below it slower. It is 0 when ``cycle_cost <= 1`` (a
    cycle that costs no more than a plain step pays at any acceptance) and NaN when ``cycle_cost >
    draft_len + 1`` (even an acceptance of 1 does not pay for the cycle). Acceptance is a
    probability: no unit.
    """
    cost = require_real("cycle_cost", cycle_cost, 0, strict_min=True)
    k = require_int("draft_len", draft_len, 0)
    tol = require_real("tol", tol, 0, strict_min=True)
    if cost <= 1:
        return 0.0
    if cost > k + 1:
        return math.nan
    low, high = 0.0, 1.0
    while high - low > tol:
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens_per_cycle(mid, k) < cost else (low, mid)
    return high
