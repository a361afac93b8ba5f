"""The multi-tenant assistant design exercise (bank entry D1), computed with
``servelab.metrics.capacity``.

Every planning input is a field of :class:`DesignAssumptions`, so an instructor or a student changes
one argument and the whole table follows::

    solve_design(DesignAssumptions(per_replica_rate=3.0)).plan.total

Nothing is computed here that ``servelab.metrics.capacity`` already computes; this module only wires
the exercise's assumptions into those functions and lays the results out as a table.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.metrics import capacity
from servelab.metrics.capacity import CostBreakdown, ReplicaPlan

__all__ = [
    "DesignAssumptions",
    "DesignResult",
    "design_rows",
    "design_table_markdown",
    "solve_design",
]


@dataclass(frozen=True)
class DesignAssumptions:
    """Editable interview assumptions of the exercise (not specifications of any product).

    Traffic: ``requests_per_day`` over ``active_hours`` with peaks ``peak_factor`` times the mean
    and ``retry_allowance`` extra attempts; each request is in service for ``service_time_s`` on
    average.
    Replicas: one complete replica sustains ``per_replica_rate`` requests/s within the latency SLO
    on this request mix, planned at ``planning_utilization``, plus ``spare_replicas`` for failures.
    Memory: an illustrative ``params``-parameter model with 80 layers and 8 KV heads; every request
    in flight holds a KV reservation for the class's maximum input and output, and the reservations
    must cover the count in flight with probability ``in_flight_quantile`` (the problem statement
    gives ``stated_reservations`` instead, a fixed margin over the mean; both are shown). Cost:
    hosted token prices ($ per million tokens) versus owned replicas at ``replica_hourly_rate``;
    both pay the same fixed operating costs (application, maintenance, quality review).
    """

    requests_per_day: float = 100_000
    active_hours: float = 16
    peak_factor: float = 8
    retry_allowance: float = 0.05
    service_time_s: float = 8.0
    per_replica_rate: float = 4.0
    planning_utilization: float = 0.7
    spare_replicas: int = 1
    params: float = 70e9
    weight_bytes_per_param: float = 2
    max_input_tokens: int = 4_096
    max_output_tokens: int = 512
    n_layers: int = 80
    n_kv_heads: int = 8
    head_dim: int = 128
    kv_bytes_per_elem: int = 2
    in_flight_quantile: float = 0.99
    stated_reservations: int = 48
    days_per_month: int = 30
    mean_input_tokens: float = 2_000
    mean_output_tokens: float = 250
    input_price_per_m: float = 0.50
    cached_input_price_per_m: float = 0.05
    cached_input_share: float = 0.30
    output_price_per_m: float = 2.00
    application_cost: float = 600.0
    maintenance_cost: float = 1_500.0
    review_hours: float = 500.0
    review_rate: float = 35.0
    useful_fraction: float = 0.97
    replica_hourly_rate: float = 6.0
    hours_per_month: float = 720


@dataclass(frozen=True)
class DesignResult:
    """Every number of the exercise's table, with the assumptions that produced it.

    ``in_flight_peak`` is the whole service's mean concurrency at peak; ``in_flight_per_replica``
    that of one replica running at its measured rate, the load its KV ``reservations`` must carry.
    """

    assumptions: DesignAssumptions
    peak_rate: float
    in_flight_peak: float
    plan: ReplicaPlan
    in_flight_per_replica: float
    reservations: int
    kv_bytes_per_request: int
    weight_bytes: float
    requests_per_month: float
    hosted: CostBreakdown
    owned: CostBreakdown

    @property
    def in_flight_per_serving_replica(self) -> float:
        """Mean concurrency each serving replica carries at the planned peak (requests)."""
        return self.in_flight_peak / self.plan.serving

    @property
    def kv_gib_per_request(self) -> float:
        """Raw KV a maximal request must reserve, GiB."""
        return capacity.to_gib(self.kv_bytes_per_request)

    @property
    def kv_gib_reserved(self) -> float:
        """Raw KV of one replica's ``reservations`` maximal requests, GiB (weights and workspace
        excluded)."""
        return self.reservations * self.kv_gib_per_request

    @property
    def memory_gib_per_replica(self) -> float:
        """Weights plus reserved KV of one replica, GiB, before activations and runtime
        workspaces."""
        return capacity.to_gib(self.weight_bytes) + self.kv_gib_reserved


def solve_design(assumptions: DesignAssumptions | None = None) -> DesignResult:
    """Compute concurrency, replicas, KV reservations, memory and monthly cost for
    ``assumptions``."""
    a = DesignAssumptions() if assumptions is None else assumptions
    if not isinstance(a, DesignAssumptions):
        raise TypeError(f"assumptions must be a DesignAssumptions, got {type(a).__name__}")
    peak = capacity.peak_arrival_rate(
        a.requests_per_day, a.active_hours, a.peak_factor, a.retry_allowance
    )
    plan = capacity.replicas_needed(
        peak, a.per_replica_rate, a.planning_utilization, a.spare_replicas
    )
    per_replica = capacity.requests_in_flight(a.per_replica_rate, a.service_time_s)
    kv_bytes = capacity.kv_bytes_per_request(
        a.max_input_tokens,
        a.max_output_tokens,
        a.n_layers,
        a.n_kv_heads,
        a.head_dim,
        a.kv_bytes_per_elem,
    )
    per_month = capacity.monthly_requests(a.requests_per_day, a.days_per_month)
    return DesignResult(
        a, peak, capacity.requests_in_flight(peak, a.service_time_s), plan, per_replica,
        capacity.in_flight_quantile(per_replica, a.in_flight_quantile), kv_bytes,
        capacity.weight_bytes(a.params, a.weight_bytes_per_param), per_month,
        _hosted(a, per_month), _owned(a, plan.total, per_month),
    )


def _allowances(a: DesignAssumptions) -> dict[str, float]:
    return capacity.operating_allowances(
        a.application_cost, a.maintenance_cost, a.review_hours, a.review_rate
    )


def _hosted(a: DesignAssumptions, per_month: float) -> CostBreakdown:
    return capacity.hosted_cost(
        requests_per_month=per_month,
        attempt_factor=1 + a.retry_allowance,
        input_tokens=a.mean_input_tokens,
        output_tokens=a.mean_output_tokens,
        input_price_per_m=a.input_price_per_m,
        cached_input_price_per_m=a.cached_input_price_per_m,
        cached_input_share=a.cached_input_share,
        output_price_per_m=a.output_price_per_m,
        useful_fraction=a.useful_fraction,
        allowances=_allowances(a),
    )


def _owned(a: DesignAssumptions, replicas: int, per_month: float) -> CostBreakdown:
    return capacity.owned_cost(
        replicas=replicas,
        hourly_rate=a.replica_hourly_rate,
        hours_per_month=a.hours_per_month,
        requests_per_month=per_month,
        useful_fraction=a.useful_fraction,
        allowances=_allowances(a),
    )


def _usd(x: float) -> str:
    return f"${x:,.2f}"


def _traffic_rows(r: DesignResult) -> list[tuple[str, str, str]]:
    a = r.assumptions
    return [
        (
            "Peak attempts",
            f"{r.peak_rate:.2f} req/s",
            f"{a.requests_per_day:,.0f} / ({a.active_hours:g} h × 3600) × "
            f"{a.peak_factor:g} × {1 + a.retry_allowance:g}",
        ),
        (
            "Requests in flight at peak",
            f"{r.in_flight_peak:.1f}",
            f"{r.peak_rate:.2f} req/s × {a.service_time_s:g} s mean service time (Little's law)",
        ),
        (
            "Budget per replica",
            f"{r.plan.budget_per_replica:.2f} req/s",
            f"{a.per_replica_rate:g} req/s within the SLO × {a.planning_utilization:g} "
            f"planning utilisation",
        ),
        (
            "Serving replicas",
            f"{r.plan.serving}",
            f"ceil({r.peak_rate:.2f} / {r.plan.budget_per_replica:.2f})",
        ),
        (
            "Total replicas",
            f"{r.plan.serving} + {r.plan.spare} = {r.plan.total}",
            f"{r.plan.spare} spare so that losing a replica keeps the serving capacity",
        ),
        (
            "In flight per serving replica at peak",
            f"{r.in_flight_per_serving_replica:.1f}",
            f"{r.in_flight_peak:.1f} / {r.plan.serving} serving replicas",
        ),
    ]


def _memory_rows(r: DesignResult) -> list[tuple[str, str, str]]:
    a = r.assumptions
    pct = f"{100 * a.in_flight_quantile:g} %"
    stated_exceeds = 100 * capacity.in_flight_exceedance(
        r.in_flight_per_replica, a.stated_reservations
    )
    derived_exceeds = 100 * capacity.in_flight_exceedance(r.in_flight_per_replica, r.reservations)
    return [
        (
            "In flight per replica at its measured rate",
            f"{r.in_flight_per_replica:.1f}",
            f"{a.per_replica_rate:g} req/s × {a.service_time_s:g} s: the load it was "
            f"measured to sustain, above the"
            f" {r.in_flight_per_serving_replica:.1f} planned, so that memory never caps it "
            f"below that rate",
        ),
        (
            "KV reservations per replica",
            f"{r.reservations}",
            f"the count in flight stays at or below it {pct} of the time (Poisson with "
            f"mean {r.in_flight_per_replica:.1f})",
        ),
        (
            "KV per maximal request",
            f"{r.kv_gib_per_request:.6g} GiB",
            f"({a.max_input_tokens:,} + {a.max_output_tokens}) tokens × 2 × {a.n_layers} "
            f"layers × {a.n_kv_heads} KV heads"
            f" × {a.head_dim} × {a.kv_bytes_per_elem} B",
        ),
        (
            f"KV for {r.reservations} reservations",
            f"{r.kv_gib_reserved:.4g} GiB",
            f"{r.reservations} × {r.kv_gib_per_request:.6g} GiB",
        ),
        (
            f"As stated: KV for {a.stated_reservations} reservations",
            f"{a.stated_reservations * r.kv_gib_per_request:.4g} GiB",
            f"the problem statement's count: "
            f"{a.stated_reservations / r.in_flight_per_replica:.2g} × the mean, a fixed"
            f" margin; a Poisson count exceeds it"
            f" {stated_exceeds:.2f} % of the time, the derived {r.reservations} "
            f"{derived_exceeds:.2f} %",
        ),
        (
            "Memory per replica",
            f"{r.memory_gib_per_replica:.1f} GiB",
            f"weights {a.params / 1e9:g}B × {a.weight_bytes_per_param:g} B = "
            f"{capacity.to_gib(r.weight_bytes):.1f} GiB"
            f" + KV {r.kv_gib_reserved:.4g} GiB, before activations and workspaces",
        ),
    ]


def _cost_rows(r: DesignResult) -> list[tuple[str, str, str]]:
    a, hosted, owned = r.assumptions, r.hosted, r.owned
    attempts = r.requests_per_month * (1 + a.retry_allowance)
    tokens = " + ".join(f"{k} {_usd(v)}" for k, v in hosted.usage_items.items())
    fixed = " + ".join(f"{k} {_usd(v)}" for k, v in hosted.fixed_items.items())
    return [
        (
            "Hosted, token bill per month",
            _usd(hosted.usage_total),
            f"{attempts:,.0f} attempts × ({a.mean_input_tokens:,.0f} in, "
            f"{a.mean_output_tokens:,.0f} out) tokens: {tokens}",
        ),
        (
            "Fixed costs per month (either option)",
            _usd(hosted.fixed_total),
            f"{fixed} ({a.review_hours:g} h × {_usd(a.review_rate)}/h)",
        ),
        (
            "Hosted, per 1,000 requests",
            _usd(hosted.per_1000_requests),
            f"tokens {_usd(hosted.per_1000(hosted.usage_total))} + fixed "
            f"{_usd(hosted.per_1000(hosted.fixed_total))}"
            f" over {r.requests_per_month:,.0f} requests/month",
        ),
        (
            "Hosted, per 1,000 useful completions",
            _usd(hosted.per_1000_useful),
            f"divided by the useful fraction {a.useful_fraction:g}",
        ),
        (
            "Owned, replica hours per month",
            _usd(owned.usage_total),
            f"{r.plan.total} replicas × {_usd(a.replica_hourly_rate)}/h × {a.hours_per_month:g} h",
        ),
        (
            "Owned, per 1,000 requests",
            _usd(owned.per_1000_requests),
            f"hours {_usd(owned.per_1000(owned.usage_total))} + fixed "
            f"{_usd(owned.per_1000(owned.fixed_total))}",
        ),
    ]


def design_rows(result: DesignResult) -> list[tuple[str, str, str]]:
    """The exercise's table as ``(quantity, value, how it is computed)`` rows, values formatted:
    traffic and replicas, then KV and memory, then cost."""
    return _traffic_rows(result) + _memory_rows(result) + _cost_rows(result)


def design_table_markdown(result: DesignResult) -> str:
    """The rows of :func:`design_rows` as a Markdown table."""
    lines = ["| Quantity | Value | How |", "|---|---|---|"]
    lines += [f"| {q} | {v} | {how} |" for q, v, how in design_rows(result)]
    return "\n".join(lines)
