"""Multi-LoRA serving on one replica: adapter identity, the registry, host and GPU caches, and a
simulation.

:class:`AdapterRegistry` (the trusted control plane), :class:`GpuAdapterCache` (adapter slots with
per-request references; LRU eviction of unreferenced adapters only) and
:func:`simulate_adapter_serving`, which runs the cache-miss loading sequence for a stream of
requests: resolve and verify the digest -> bounded host (CPU) cache -> reserve a GPU adapter slot
-> transfer -> bind the request to that adapter version -> release on completion or cancellation.

The simulation runs in milliseconds of simulated time and never touches tensors.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from servelab._validate import require_int, require_real

__all__ = [
    "AdapterArtifact",
    "AdapterKey",
    "AdapterRecord",
    "AdapterRegistry",
    "AdapterRequest",
    "AdapterSimResult",
    "DigestMismatch",
    "GpuAdapterCache",
    "HostAdapterCache",
    "IncompatibleAdapter",
    "LoadCosts",
    "NoEvictableAdapter",
    "adapter_workload",
    "sha256_hex",
    "simulate_adapter_serving",
]


# identity, registry, caches


class DigestMismatch(ValueError):
    """An adapter's bytes do not hash to the digest the registry published."""


class IncompatibleAdapter(ValueError):
    """An adapter was trained for another base model."""


class NoEvictableAdapter(RuntimeError):
    """Every GPU adapter slot is held by an adapter with in-flight requests."""


def sha256_hex(payload: bytes) -> str:
    """Hex SHA-256 of ``payload``: the content digest that names an adapter's bytes."""
    if not isinstance(payload, (bytes, bytearray)):
        raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
    return hashlib.sha256(payload).hexdigest()


@dataclass(frozen=True)
class AdapterKey:
    """Cache identity of a loaded adapter: base model + adapter content digest + version.

    ``name`` is the alias tenants ask for; it is a label, not part of the identity (two versions of
    one alias are two cache entries, and so are two bases). The same key salts the prefix cache
    (:meth:`namespace`), so KV computed under one adapter version is never reused under another.
    """

    base_model: str
    digest: str
    version: int
    name: str = field(default="", compare=False)

    def namespace(self) -> str:
        """Prefix-cache namespace for requests bound to this adapter (see ``BlockAllocator``)."""
        return f"{self.base_model}|{self.digest}|v{self.version}"

    def label(self) -> str:
        return f"{self.name}@v{self.version}"


@dataclass(frozen=True)
class AdapterArtifact:
    """What the trusted control plane published: alias, version, base model, bytes and their digest.

    ``size_bytes`` is the adapter's tensor size used for timing; ``payload`` stands in for its
    content (what the digest is checked against); ``published_ms`` is when the version became
    resolvable.
    """

    name: str
    version: int
    base_model: str
    size_bytes: int
    payload: bytes
    digest: str
    published_ms: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        require_int("version", self.version, 1)
        require_int("size_bytes", self.size_bytes, 1)
        require_real("published_ms", self.published_ms, 0)

    @property
    def key(self) -> AdapterKey:
        return AdapterKey(self.base_model, self.digest, self.version, self.name)


class AdapterRegistry:
    """Trusted control plane: publishes adapter versions; serving only resolves authorised
    aliases."""

    def __init__(self) -> None:
        self._versions: dict[str, list[AdapterArtifact]] = {}

    def publish(
        self,
        name: str,
        version: int,
        base_model: str,
        size_bytes: int,
        payload: bytes | None = None,
        published_ms: float = 0.0,
        digest: str | None = None,
    ) -> AdapterArtifact:
        """Register a version. ``payload`` defaults to bytes derived from name and version;
        ``digest`` defaults to its SHA-256 (pass another to model a corrupted or tampered
        artifact)."""
        payload = f"{name}/v{version}".encode() if payload is None else payload
        artifact = AdapterArtifact(name, version, base_model, size_bytes, payload,
                                   sha256_hex(payload) if digest is None else digest, published_ms)
        versions = self._versions.setdefault(name, [])
        if any(a.version == version for a in versions):
            raise ValueError(f"version {version} of adapter {name!r} is already published")
        versions.append(artifact)
        versions.sort(key=lambda a: (a.published_ms, a.version))
        return artifact

    def resolve(self, name: str, base_model: str, at_ms: float) -> AdapterArtifact:
        """Step 1: the newest version of ``name`` published by ``at_ms``, checked for base
        compatibility and for bytes matching the published digest."""
        live = [a for a in self._versions.get(name, []) if a.published_ms <= at_ms]
        if not live:
            raise KeyError(f"adapter {name!r} has no version published by t={at_ms} ms")
        artifact = live[-1]
        if artifact.base_model != base_model:
            raise IncompatibleAdapter(
                f"adapter {artifact.key.label()} targets base {artifact.base_model!r}, "
                f"this replica serves {base_model!r}"
            )
        if sha256_hex(artifact.payload) != artifact.digest:
            raise DigestMismatch(f"adapter {artifact.key.label()}: bytes do not match digest "
                                 f"{artifact.digest[:12]}...")
        return artifact


class HostAdapterCache:
    """Bounded CPU (host) cache of verified adapter bytes, LRU by use, ``capacity_bytes`` in bytes.

    A host copy is never referenced by a running request (the GPU copy is), so any entry may go.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = require_int("capacity_bytes", capacity_bytes, 0)
        self._entries: OrderedDict[AdapterKey, int] = OrderedDict()

    def __contains__(self, key: AdapterKey) -> bool:
        return key in self._entries

    @property
    def used_bytes(self) -> int:
        return sum(self._entries.values())

    def touch(self, key: AdapterKey) -> None:
        self._entries.move_to_end(key)

    def put(self, key: AdapterKey, size_bytes: int) -> list[AdapterKey]:
        """Store ``key`` (if it fits at all), evicting least recently used entries; returns the
        evicted."""
        evicted = []
        if size_bytes > self.capacity_bytes:
            return evicted
        self._entries[key] = size_bytes
        self._entries.move_to_end(key)
        while self.used_bytes > self.capacity_bytes:
            evicted.append(self._entries.popitem(last=False)[0])
        return evicted


class GpuAdapterCache:
    """``capacity`` GPU adapter slots. Each resident adapter counts the in-flight requests bound to
    it.

    Eviction (LRU by last release or bind) considers only adapters with zero references; when every
    slot is referenced, :meth:`reserve` raises :class:`NoEvictableAdapter` and the caller waits.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = require_int("capacity", capacity, 1)
        self._refs: OrderedDict[AdapterKey, set[str]] = OrderedDict()

    def __contains__(self, key: AdapterKey) -> bool:
        return key in self._refs

    @property
    def resident(self) -> list[AdapterKey]:
        """Resident adapters, least recently used first."""
        return list(self._refs)

    def refcount(self, key: AdapterKey) -> int:
        return len(self._refs[key])

    def can_reserve(self) -> bool:
        return len(self._refs) < self.capacity or any(not r for r in self._refs.values())

    def reserve(self, key: AdapterKey) -> AdapterKey | None:
        """Step 3: make room for ``key``; returns the adapter evicted (None if a slot was free)."""
        if key in self._refs:
            raise ValueError(f"adapter {key.label()} is already resident")
        victim = None
        if len(self._refs) >= self.capacity:
            victim = next((k for k, refs in self._refs.items() if not refs), None)
            if victim is None:
                raise NoEvictableAdapter(
                    f"all {self.capacity} adapter slots have in-flight requests"
                )
            del self._refs[victim]
        self._refs[key] = set()
        return victim

    def bind(self, key: AdapterKey, request_id: str) -> None:
        """Step 5: ``request_id`` holds ``key`` until :meth:`release`."""
        if key not in self._refs:
            raise KeyError(f"adapter {key.label()} is not resident")
        if request_id in self._refs[key]:
            raise ValueError(f"request {request_id!r} is already bound to {key.label()}")
        self._refs[key].add(request_id)
        self._refs.move_to_end(key)

    def release(self, key: AdapterKey, request_id: str) -> bool:
        """Step 6: drop ``request_id``'s reference (idempotent: False when it held none)."""
        refs = self._refs.get(key)
        if refs is None or request_id not in refs:
            return False
        refs.discard(request_id)
        self._refs.move_to_end(key)
        return True


# the serving simulation


@dataclass(frozen=True)
class LoadCosts:
    """Costs of the loading sequence: storage and host->GPU bandwidth (bytes per ms), digest hashing
    (bytes per ms) and a fixed per-transfer setup (ms)."""

    storage_bytes_per_ms: float
    h2d_bytes_per_ms: float
    hash_bytes_per_ms: float
    setup_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("storage_bytes_per_ms", "h2d_bytes_per_ms", "hash_bytes_per_ms"):
            require_real(name, getattr(self, name), 0, strict_min=True)
        require_real("setup_ms", self.setup_ms, 0)


@dataclass(frozen=True)
class AdapterRequest:
    """A generation request naming an adapter alias. Times in ms: ``service_ms`` is model compute
    once admitted (adapter loading excluded); ``cancel_after_ms`` (after arrival) models a client
    that goes away; ``deadline_ms`` (after arrival) is the latest admission the request accepts."""

    request_id: str
    arrival_ms: float
    adapter: str
    service_ms: float
    cancel_after_ms: float | None = None
    deadline_ms: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError(f"request_id must be a non-empty str, got {self.request_id!r}")
        require_real("arrival_ms", self.arrival_ms, 0)
        require_real("service_ms", self.service_ms, 0, strict_min=True)
        for name in ("cancel_after_ms", "deadline_ms"):
            if getattr(self, name) is not None:
                require_real(name, getattr(self, name), 0)


@dataclass(frozen=True)
class AdapterRecord:
    """One request's outcome. ``status``: finished, cancelled, timed_out or failed. ``gpu_hit``: its
    adapter was resident and loaded at admission; ``load_ms``: cold-load delay (hashing, fetch,
    transfer), kept apart from ``service_ms``; ``steps``: the loading sequence as (step, detail)
    pairs."""

    request_id: str
    adapter: str
    key: AdapterKey | None
    status: str
    arrival_ms: float
    admit_ms: float | None
    start_ms: float | None
    end_ms: float
    gpu_hit: bool
    host_hit: bool
    load_ms: float
    steps: tuple[tuple[str, str], ...]

    @property
    def wait_ms(self) -> float:
        """Queueing before admission (including waits for a free or evictable adapter slot)."""
        return (self.admit_ms if self.admit_ms is not None else self.end_ms) - self.arrival_ms


@dataclass(frozen=True)
class AdapterSimResult:
    """Records in arrival order plus counters: GPU cold loads, storage fetches, evictions."""

    records: tuple[AdapterRecord, ...]
    cold_loads: int
    storage_fetches: int
    evictions: tuple[AdapterKey, ...]

    def _admitted(self) -> list[AdapterRecord]:
        return [r for r in self.records if r.admit_ms is not None]

    @property
    def gpu_hit_rate(self) -> float:
        """Share of admitted requests whose adapter was already resident and loaded."""
        admitted = self._admitted()
        return sum(r.gpu_hit for r in admitted) / len(admitted) if admitted else 0.0

    @property
    def mean_load_ms(self) -> float:
        admitted = self._admitted()
        return sum(r.load_ms for r in admitted) / len(admitted) if admitted else 0.0

    @property
    def mean_wait_ms(self) -> float:
        return sum(r.wait_ms for r in self.records) / len(self.records)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.records)


@dataclass
class _Sim:
    """Mutable state of one simulation run."""

    registry: AdapterRegistry
    base_model: str
    gpu: GpuAdapterCache
    host: HostAdapterCache
    costs: LoadCosts
    free_slots: int
    queue: list[AdapterRequest] = field(default_factory=list)
    ready_at: dict[AdapterKey, float] = field(default_factory=dict)
    events: list = field(default_factory=list)
    records: dict[str, AdapterRecord] = field(default_factory=dict)
    cold_loads: int = 0
    storage_fetches: int = 0
    evictions: list[AdapterKey] = field(default_factory=list)
    order: itertools.count = field(default_factory=itertools.count)

    def push(self, at: float, kind: str, payload: object) -> None:
        heapq.heappush(self.events, (at, next(self.order), kind, payload))


def _load(sim: _Sim, artifact: AdapterArtifact, now: float) -> tuple[bool, list[tuple[str, str]]]:
    """Steps 2 and 4 for a non-resident adapter whose slot is reserved: sets when it is ready and
    returns (host-cache hit, step records)."""
    key, size, costs = artifact.key, artifact.size_bytes, sim.costs
    steps = []
    host_hit = key in sim.host
    if host_hit:
        sim.host.touch(key)
        fetch = 0.0
        steps.append(("2 host cache", "hit"))
    else:
        fetch = size / costs.storage_bytes_per_ms + size / costs.hash_bytes_per_ms
        sim.storage_fetches += 1
        dropped = sim.host.put(key, size)
        steps.append(("2 host cache", f"miss: fetched and re-verified in {fetch:.1f} ms"
                      + (f", dropped {', '.join(k.label() for k in dropped)}" if dropped else "")))
    transfer = costs.setup_ms + size / costs.h2d_bytes_per_ms
    sim.cold_loads += 1
    steps.append(("4 transfer", f"{transfer:.1f} ms host->GPU"))
    sim.ready_at[key] = now + fetch + transfer
    return host_hit, steps


def _try_admit(sim: _Sim, req: AdapterRequest, now: float) -> bool:
    """Run the loading sequence for the queue head; False when it must wait for an adapter slot."""
    steps: list[tuple[str, str]] = []
    try:
        artifact = sim.registry.resolve(req.adapter, sim.base_model, now)
    except (KeyError, IncompatibleAdapter, DigestMismatch) as error:
        sim.records[req.request_id] = AdapterRecord(
            req.request_id,
            req.adapter,
            None,
            "failed",
            req.arrival_ms,
            None,
            None,
            now,
            False,
            False,
            0.0,
            (("1 resolve+verify", str(error)),),
        )
        return True
    key = artifact.key
    steps.append(("1 resolve+verify", f"{key.label()} digest {key.digest[:8]} ok"))
    host_hit, gpu_hit = True, False
    if key in sim.gpu:
        gpu_hit = sim.ready_at[key] <= now
        steps.append(("3 reserve", "resident" if gpu_hit else "resident, still loading: join"))
    else:
        if not sim.gpu.can_reserve():
            return False
        victim = sim.gpu.reserve(key)
        if victim is not None:
            sim.evictions.append(victim)
            sim.ready_at.pop(victim)
        steps.append(
            ("3 reserve", "free slot" if victim is None else f"evicted {victim.label()} (0 refs)")
        )
        host_hit, load_steps = _load(sim, artifact, now)
        steps[1:1] = load_steps[:1]  # the host-cache step (2) comes before the reservation (3)
        steps.extend(load_steps[1:])
    sim.gpu.bind(key, req.request_id)
    steps.append(("5 bind", key.label()))
    sim.free_slots -= 1
    start = max(now, sim.ready_at[key])
    end, status = start + req.service_ms, "finished"
    if req.cancel_after_ms is not None and req.arrival_ms + req.cancel_after_ms < end:
        end, status = max(now, req.arrival_ms + req.cancel_after_ms), "cancelled"
    record = AdapterRecord(
        req.request_id,
        req.adapter,
        key,
        status,
        req.arrival_ms,
        now,
        start,
        end,
        gpu_hit,
        host_hit,
        start - now if not gpu_hit else 0.0,
        tuple(steps),
    )
    sim.push(end, "end", record)
    return True


def _dispatch(sim: _Sim, now: float) -> None:
    """Admit from the head of the FIFO queue while batch slots last and the head can get its
    adapter."""
    while sim.queue and sim.free_slots > 0:
        req = sim.queue[0]
        if req.cancel_after_ms is not None and now >= req.arrival_ms + req.cancel_after_ms:
            status, at = "cancelled", req.arrival_ms + req.cancel_after_ms
        elif req.deadline_ms is not None and now > req.arrival_ms + req.deadline_ms:
            status, at = "timed_out", req.arrival_ms + req.deadline_ms
        elif _try_admit(sim, req, now):
            sim.queue.pop(0)
            continue
        else:
            return  # the head waits for an adapter slot; FIFO: nobody overtakes it
        sim.queue.pop(0)
        sim.records[req.request_id] = AdapterRecord(
            req.request_id,
            req.adapter,
            None,
            status,
            req.arrival_ms,
            None,
            None,
            at,
            False,
            False,
            0.0,
            (),
        )


def simulate_adapter_serving(
    requests: Sequence[AdapterRequest],
    registry: AdapterRegistry,
    base_model: str,
    gpu_slots: int,
    host_bytes: int,
    max_running: int,
    costs: LoadCosts,
) -> AdapterSimResult:
    """Serve ``requests`` on one replica of ``base_model`` with ``gpu_slots`` adapter slots, a host
    cache of ``host_bytes`` bytes and ``max_running`` concurrent requests, FIFO admission.

    Admission runs the loading sequence (module docstring). A request whose adapter is resident
    binds at once (joining a load still in flight); otherwise it needs a free slot or an adapter
    with no references to evict, else it waits at the head of the queue. It releases its batch slot
    and adapter reference when it finishes or is cancelled. A queued request whose deadline passes
    times out; one whose adapter fails to resolve or verify fails without touching either cache.
    """
    if not isinstance(requests, (list, tuple)) or not requests:
        raise ValueError("requests must be a non-empty list or tuple of AdapterRequest")
    if not all(isinstance(r, AdapterRequest) for r in requests):
        raise TypeError("requests must contain only AdapterRequest objects")
    if len({r.request_id for r in requests}) != len(requests):
        raise ValueError("requests must have unique request_id values")
    if not isinstance(registry, AdapterRegistry):
        raise TypeError(f"registry must be an AdapterRegistry, got {type(registry).__name__}")
    if not isinstance(costs, LoadCosts):
        raise TypeError(f"costs must be a LoadCosts, got {type(costs).__name__}")
    sim = _Sim(
        registry,
        base_model,
        GpuAdapterCache(gpu_slots),
        HostAdapterCache(host_bytes),
        costs,
        require_int("max_running", max_running, 1),
    )
    for req in requests:
        sim.push(req.arrival_ms, "arrive", req)
    while sim.events:
        now, _, kind, payload = heapq.heappop(sim.events)
        if kind == "arrive":
            sim.queue.append(payload)
        else:
            sim.free_slots += 1
            released = sim.gpu.release(payload.key, payload.request_id)
            release = (
                "6 release",
                f"{payload.status}: reference dropped" if released else "no reference held",
            )
            sim.records[payload.request_id] = replace(payload, steps=payload.steps + (release,))
        _dispatch(sim, now)
    return AdapterSimResult(tuple(sim.records[r.request_id] for r in requests), sim.cold_loads,
                            sim.storage_fetches, tuple(sim.evictions))


def adapter_workload(
    num_requests: int,
    adapters: Sequence[str],
    *,
    mean_gap_ms: float,
    service_ms: float,
    skew: float,
    cancel_share: float = 0.0,
    seed: int = 0,
) -> list[AdapterRequest]:
    """Poisson arrivals (mean gap ``mean_gap_ms``) choosing adapters with popularity ``1 /
    rank**skew``; service times exponential around ``service_ms``; a share ``cancel_share`` of
    clients cancel after a uniform fraction of their service time. Drawn from
    ``random.Random(seed)``."""
    n = require_int("num_requests", num_requests, 1)
    if not adapters:
        raise ValueError("adapters must name at least one adapter")
    gap = require_real("mean_gap_ms", mean_gap_ms, 0, strict_min=True)
    service = require_real("service_ms", service_ms, 0, strict_min=True)
    s = require_real("skew", skew, 0)
    c = require_real("cancel_share", cancel_share, 0)
    if c > 1:
        raise ValueError(f"cancel_share must be in [0, 1], got {cancel_share}")
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** s for i in range(len(adapters))]
    now, out = 0.0, []
    for i in range(n):
        now += rng.expovariate(1 / gap)
        work = max(1.0, rng.expovariate(1 / service))
        cancel = rng.uniform(0, work) if rng.random() < c else None
        out.append(AdapterRequest(f"r{i}", round(now, 3), rng.choices(list(adapters), weights)[0],
                                  round(work, 3), None if cancel is None else round(cancel, 3)))
    return out
