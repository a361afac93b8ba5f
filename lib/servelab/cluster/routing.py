"""In front of the engines: which replica gets a request, and how many requests a tenant may have in
flight.

Two small pieces a gateway owns:

* :func:`route_requests` -- a discrete-event simulation of several replicas, each with its own
  prefix cache, under four routing policies. It exists to show that the replica with the best
  prefix-cache hit is not always the one that finishes a request first: a hot prefix pulled onto one
  replica builds a queue there that the saved prefill cannot pay for.
* :class:`TenantQuota` -- the per-tenant in-flight limit, the fourth of the admission limits (next
  to batch slots, the token budget and KV blocks, which the engine's scheduler enforces itself).

System boundary (routing): a replica serves one request at a time, first come first served; a
request costs ``prefill_ms_per_token`` for every prompt token not covered by a cache hit plus
``decode_ms_per_token`` for every output token. A replica's cache holds the ``cache_slots`` most
recently routed prefixes (LRU) and is updated when the request is routed, so the router's view of
the cache is exact. Nothing here runs a model; times are milliseconds of simulated time.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from servelab._validate import require_int
from servelab.lifecycle.state_machine import SlotPool

__all__ = [
    "ROUTING_POLICIES",
    "PrefixRequest",
    "ReplicaModel",
    "RoutedRequest",
    "RoutingResult",
    "TenantQuota",
    "prefix_workload",
    "route_requests",
]

ROUTING_POLICIES = ("round-robin", "least-loaded", "max-hit", "min-completion")


def _check_number(name: str, value: object, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number >= {minimum}, got {type(value).__name__}")
    if not value >= minimum:
        raise ValueError(f"{name} must be a number >= {minimum}, got {value}")
    return float(value)


@dataclass(frozen=True)
class PrefixRequest:
    """A request whose prompt is a shared prefix (``prefix`` names it) followed by private tokens.

    ``arrival`` is in milliseconds; token counts are the prefix length, the private suffix length
    and the number of output tokens.
    """

    name: str
    arrival: float
    prefix: str
    prefix_tokens: int
    suffix_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.prefix, str):
            raise TypeError(f"prefix must be a str, got {type(self.prefix).__name__}")
        _check_number("arrival", self.arrival)
        require_int("prefix_tokens", self.prefix_tokens, 0)
        require_int("suffix_tokens", self.suffix_tokens, 1)
        require_int("output_tokens", self.output_tokens, 1)


@dataclass(frozen=True)
class ReplicaModel:
    """Cost model shared by every replica (milliseconds per token; cache size in prefixes)."""

    prefill_ms_per_token: float
    decode_ms_per_token: float
    cache_slots: int

    def __post_init__(self) -> None:
        _check_number("prefill_ms_per_token", self.prefill_ms_per_token)
        _check_number("decode_ms_per_token", self.decode_ms_per_token)
        require_int("cache_slots", self.cache_slots, 1)

    def service_ms(self, request: PrefixRequest, hit: bool) -> float:
        """Time one replica spends on ``request``; a hit skips the prefix's prefill."""
        prefill = request.suffix_tokens + (0 if hit else request.prefix_tokens)
        return (
            prefill * self.prefill_ms_per_token + request.output_tokens * self.decode_ms_per_token
        )


@dataclass(frozen=True)
class RoutedRequest:
    """Where a request went and when it ran (milliseconds)."""

    name: str
    replica: int
    hit: bool
    arrival: float
    start: float
    finish: float

    @property
    def completion_ms(self) -> float:
        """Arrival to last token: queueing plus service."""
        return self.finish - self.arrival

    @property
    def wait_ms(self) -> float:
        """Time spent queued behind other requests on the chosen replica."""
        return self.start - self.arrival


@dataclass(frozen=True)
class RoutingResult:
    """Outcome of one policy on one workload."""

    policy: str
    num_replicas: int
    requests: tuple[RoutedRequest, ...]

    @property
    def hit_rate(self) -> float:
        """Fraction of requests whose prefix was in the chosen replica's cache."""
        return sum(r.hit for r in self.requests) / len(self.requests)

    @property
    def mean_completion_ms(self) -> float:
        return sum(r.completion_ms for r in self.requests) / len(self.requests)

    def completion_percentile_ms(self, q: float) -> float:
        """Nearest-rank percentile ``q`` (0 < q <= 100) of the completion times."""
        q = _check_number("q", q)
        if not 0 < q <= 100:
            raise ValueError(f"q must be in (0, 100], got {q}")
        ordered = sorted(r.completion_ms for r in self.requests)
        rank = max(1, -(-len(ordered) * q // 100))
        return ordered[int(rank) - 1]

    def requests_per_replica(self) -> list[int]:
        counts = [0] * self.num_replicas
        for r in self.requests:
            counts[r.replica] += 1
        return counts


class _Replica:
    """One replica's queue horizon and LRU prefix cache."""

    def __init__(self, cache_slots: int) -> None:
        self.free_at = 0.0
        self.cache: OrderedDict[str, None] = OrderedDict()
        self.cache_slots = cache_slots

    def has(self, prefix: str) -> bool:
        return prefix in self.cache

    def remember(self, prefix: str) -> None:
        self.cache[prefix] = None
        self.cache.move_to_end(prefix)
        while len(self.cache) > self.cache_slots:
            self.cache.popitem(last=False)

    def finish_if_sent(self, request: PrefixRequest, model: ReplicaModel) -> float:
        """When ``request`` would finish here, given this replica's queue and cache right now."""
        start = max(self.free_at, request.arrival)
        return start + model.service_ms(request, self.has(request.prefix))


def _choose(policy: str, replicas: list[_Replica], request: PrefixRequest, model: ReplicaModel,
            index: int) -> int:
    """Replica index picked by ``policy``; ties go to the lowest index."""
    ids = range(len(replicas))
    if policy == "round-robin":
        return index % len(replicas)
    if policy == "least-loaded":
        return min(ids, key=lambda i: replicas[i].free_at)
    if policy == "max-hit":
        return min(ids, key=lambda i: (not replicas[i].has(request.prefix), replicas[i].free_at))
    return min(ids, key=lambda i: replicas[i].finish_if_sent(request, model))


def route_requests(requests: Sequence[PrefixRequest], num_replicas: int, policy: str,
                   model: ReplicaModel) -> RoutingResult:
    """Route ``requests`` (in arrival order) to ``num_replicas`` replicas under ``policy``.

    Policies: ``"round-robin"`` (ignore everything), ``"least-loaded"`` (the replica free soonest),
    ``"max-hit"`` (a replica whose cache holds the prefix, else the least loaded: maximises hit
    rate), ``"min-completion"`` (the replica where this request would finish first, counting both
    its queue and the prefill a hit saves).
    """
    if not isinstance(requests, (list, tuple)) or not requests:
        raise ValueError("requests must be a non-empty list or tuple of PrefixRequest")
    if not all(isinstance(r, PrefixRequest) for r in requests):
        raise TypeError("requests must contain only PrefixRequest objects")
    if len({r.name for r in requests}) != len(requests):
        raise ValueError("requests must have unique names")
    require_int("num_replicas", num_replicas, 1)
    if policy not in ROUTING_POLICIES:
        raise ValueError(f"policy must be one of {ROUTING_POLICIES}, got {policy!r}")
    if not isinstance(model, ReplicaModel):
        raise TypeError(f"model must be a ReplicaModel, got {type(model).__name__}")
    replicas = [_Replica(model.cache_slots) for _ in range(num_replicas)]
    routed = []
    for index, request in enumerate(sorted(requests, key=lambda r: r.arrival)):
        chosen = _choose(policy, replicas, request, model, index)
        replica = replicas[chosen]
        hit = replica.has(request.prefix)
        start = max(replica.free_at, request.arrival)
        replica.free_at = start + model.service_ms(request, hit)
        replica.remember(request.prefix)
        routed.append(
            RoutedRequest(request.name, chosen, hit, request.arrival, start, replica.free_at)
        )
    return RoutingResult(policy, num_replicas, tuple(routed))


def prefix_workload(
    num_requests: int,
    *,
    mean_gap_ms: float,
    hot_share: float,
    num_cold_prefixes: int,
    prefix_tokens: int,
    suffix_tokens: int,
    output_tokens: int,
    seed: int = 0,
) -> list[PrefixRequest]:
    """A skewed multi-tenant workload: a share ``hot_share`` of requests reuse one hot prefix, the
    rest spread uniformly over ``num_cold_prefixes`` others. Arrivals are Poisson (exponential gaps
    with mean ``mean_gap_ms``), drawn from ``random.Random(seed)``."""
    require_int("num_requests", num_requests, 1)
    _check_number("mean_gap_ms", mean_gap_ms)
    if not 0 <= _check_number("hot_share", hot_share) <= 1:
        raise ValueError(f"hot_share must be in [0, 1], got {hot_share}")
    require_int("num_cold_prefixes", num_cold_prefixes, 1)
    rng = random.Random(seed)
    now, requests = 0.0, []
    for i in range(num_requests):
        now += rng.expovariate(1 / mean_gap_ms) if mean_gap_ms > 0 else 0.0
        prefix = "hot" if rng.random() < hot_share else f"cold-{rng.randrange(num_cold_prefixes)}"
        requests.append(PrefixRequest(f"q{i}", round(now, 3), prefix, prefix_tokens, suffix_tokens,
                                      output_tokens))
    return requests


class TenantQuota:
    """At most ``limit`` requests in flight per tenant; a gateway checks it before the engine sees a
    request.

    One :class:`~servelab.lifecycle.state_machine.SlotPool` per tenant, so a request's unit is
    returned exactly once however it ends (``release`` is idempotent).
    """

    def __init__(self, limit: int) -> None:
        self.limit = require_int("limit", limit, 1)
        self._pools: dict[Hashable, SlotPool] = {}
        self._tenant_of: dict[Hashable, Hashable] = {}

    def try_acquire(self, tenant: Hashable, request_id: Hashable) -> bool:
        """Take one of ``tenant``'s units for ``request_id``; False (no change) when the tenant is
        at its limit."""
        if request_id in self._tenant_of:
            raise ValueError(f"request_id {request_id!r} already holds a quota unit")
        pool = self._pools.setdefault(tenant, SlotPool(self.limit))
        if not pool.acquire(request_id):
            return False
        self._tenant_of[request_id] = tenant
        return True

    def release(self, request_id: Hashable) -> bool:
        """Give back ``request_id``'s unit; False when it held none (already released or never
        admitted)."""
        tenant = self._tenant_of.pop(request_id, None)
        return tenant is not None and self._pools[tenant].release(request_id) == 1

    def in_flight(self, tenant: Hashable) -> int:
        """Requests of ``tenant`` holding a unit now."""
        pool = self._pools.get(tenant)
        return 0 if pool is None else pool.in_use
