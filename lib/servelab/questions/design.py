"""The multi-tenant assistant design exercise (bank entry D1), computed with ``servelab.capacity``.

Every planning input is a field of :class:`DesignAssumptions`, so an instructor or a student changes
one argument and the whole table follows::

    solve_design(DesignAssumptions(per_replica_rate=3.0)).plan.total

Nothing is computed here that ``servelab.capacity`` already computes; this module only wires the
exercise's assumptions into those functions and lays the results out as a table.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab import capacity
from servelab.capacity import CostBreakdown, ReplicaPlan

__all__ = ["DesignAssumptions", "DesignResult", "design_rows", "design_table_markdown", "solve_design"]


@dataclass(frozen=True)
class DesignAssumptions:
    """Editable interview assumptions of the exercise (not specifications of any product).

    Traffic: ``requests_per_day`` over ``active_hours`` with peaks ``peak_factor`` times the mean and
    ``retry_allowance`` extra attempts. Replicas: one complete replica sustains ``per_replica_rate``
    requests/s within the latency SLO on this request mix, planned at ``planning_utilization``, plus
    ``spare_replicas`` for failures. KV: the layout of an illustrative 80-layer, 8-KV-head model and
    the request class's maximum input/output. Cost: hosted token prices ($ per million tokens) versus
    owned replicas at ``replica_hourly_rate``; both pay the same operating allowances.
    """

    requests_per_day: float = 100_000
    active_hours: float = 16
    peak_factor: float = 8
    retry_allowance: float = 0.05
    per_replica_rate: float = 4.0
    planning_utilization: float = 0.7
    spare_replicas: int = 1
    max_input_tokens: int = 4_096
    max_output_tokens: int = 512
    n_layers: int = 80
    n_kv_heads: int = 8
    head_dim: int = 128
    kv_bytes_per_elem: int = 2
    concurrent_reservations: int = 48
    days_per_month: int = 30
    mean_input_tokens: float = 2_000
    mean_output_tokens: float = 250
    input_price_per_m: float = 0.50
    cached_input_price_per_m: float = 0.05
    cached_input_share: float = 0.30
    output_price_per_m: float = 2.00
    useful_fraction: float = 0.97
    replica_hourly_rate: float = 6.0
    hours_per_month: float = 720


@dataclass(frozen=True)
class DesignResult:
    """Every number of the exercise's table, with the assumptions that produced it."""

    assumptions: DesignAssumptions
    peak_rate: float
    plan: ReplicaPlan
    kv_bytes_per_request: int
    requests_per_month: float
    hosted: CostBreakdown
    owned: CostBreakdown

    @property
    def kv_gib_per_request(self) -> float:
        """Raw KV a maximal request must reserve, GiB."""
        return capacity.to_gib(self.kv_bytes_per_request)

    @property
    def kv_gib_reserved(self) -> float:
        """Raw KV of ``concurrent_reservations`` maximal requests, GiB (weights and workspace excluded)."""
        return self.assumptions.concurrent_reservations * self.kv_gib_per_request


def solve_design(assumptions: DesignAssumptions | None = None) -> DesignResult:
    """Compute replicas, KV reservation and monthly cost for ``assumptions`` (defaults: the exercise's)."""
    a = DesignAssumptions() if assumptions is None else assumptions
    if not isinstance(a, DesignAssumptions):
        raise TypeError(f"assumptions must be a DesignAssumptions, got {type(a).__name__}")
    peak = capacity.peak_arrival_rate(a.requests_per_day, a.active_hours, a.peak_factor, a.retry_allowance)
    plan = capacity.replicas_needed(peak, a.per_replica_rate, a.planning_utilization, a.spare_replicas)
    kv_bytes = capacity.kv_bytes_per_request(
        a.max_input_tokens, a.max_output_tokens, a.n_layers, a.n_kv_heads, a.head_dim, a.kv_bytes_per_elem
    )
    per_month = capacity.monthly_requests(a.requests_per_day, a.days_per_month)
    hosted = capacity.hosted_cost(
        requests_per_month=per_month,
        attempt_factor=1 + a.retry_allowance,
        input_tokens=a.mean_input_tokens,
        output_tokens=a.mean_output_tokens,
        input_price_per_m=a.input_price_per_m,
        cached_input_price_per_m=a.cached_input_price_per_m,
        cached_input_share=a.cached_input_share,
        output_price_per_m=a.output_price_per_m,
        useful_fraction=a.useful_fraction,
    )
    owned = capacity.owned_cost(
        replicas=plan.total,
        hourly_rate=a.replica_hourly_rate,
        hours_per_month=a.hours_per_month,
        requests_per_month=per_month,
        useful_fraction=a.useful_fraction,
    )
    return DesignResult(a, peak, plan, kv_bytes, per_month, hosted, owned)


def design_rows(result: DesignResult) -> list[tuple[str, str, str]]:
    """The exercise's table as ``(quantity, value, how it is computed)`` rows, values formatted."""
    a = result.assumptions
    return [
        ("Peak attempts", f"{result.peak_rate:.2f} req/s",
         f"{a.requests_per_day:,.0f} / ({a.active_hours:g} h × 3600) × {a.peak_factor:g} × {1 + a.retry_allowance:g}"),
        ("Budget per replica", f"{result.plan.budget_per_replica:.2f} req/s",
         f"{a.per_replica_rate:g} req/s within the SLO × {a.planning_utilization:g} planning utilisation"),
        ("Serving replicas", f"{result.plan.serving}",
         f"ceil({result.peak_rate:.2f} / {result.plan.budget_per_replica:.2f})"),
        ("Total replicas", f"{result.plan.serving} + {result.plan.spare} = {result.plan.total}",
         f"{result.plan.spare} spare so that losing a replica keeps the serving capacity"),
        ("KV per maximal request", f"{result.kv_gib_per_request:.6g} GiB",
         f"({a.max_input_tokens:,} + {a.max_output_tokens}) tokens × 2 × {a.n_layers} layers × {a.n_kv_heads} KV heads"
         f" × {a.head_dim} × {a.kv_bytes_per_elem} B"),
        (f"KV for {a.concurrent_reservations} reservations", f"{result.kv_gib_reserved:.4g} GiB",
         "before weights and workspaces"),
        ("Hosted, per 1,000 requests", f"${result.hosted.per_1000_requests:.2f}",
         f"{result.requests_per_month:,.0f} requests/month, tokens billed on every attempt, plus allowances"),
        ("Hosted, per 1,000 useful completions", f"${result.hosted.per_1000_useful:.2f}",
         f"divided by the useful fraction {a.useful_fraction:g}"),
        ("Owned, per 1,000 requests", f"${result.owned.per_1000_requests:.2f}",
         f"{result.plan.total} replicas × ${a.replica_hourly_rate:g}/h × {a.hours_per_month:g} h, plus allowances"),
    ]


def design_table_markdown(result: DesignResult) -> str:
    """The rows of :func:`design_rows` as a Markdown table."""
    lines = ["| Quantity | Value | How |", "|---|---|---|"]
    lines += [f"| {q} | {v} | {how} |" for q, v, how in design_rows(result)]
    return "\n".join(lines)

