"""KV offload tiers: where a request's KV can wait outside device memory, and when loading it back
beats recomputing it.

A prefix or a preempted request's KV can be kept in device memory (HBM), host memory (CPU DRAM over
PCIe), a local SSD, or a remote store over the network. Bringing ``n`` tokens back costs ``latency +
n x m_token / bandwidth``; recomputing them is a prefill, ``2 P n`` FLOPs at the device's achieved
FLOP/s (the course's arithmetic; attention's quadratic term is left out, which understates
recompute's cost for long contexts). Per token, loading beats recompute when the tier's bandwidth
exceeds ``m_token x achieved FLOP/s / (2 P)`` (:func:`reload_breakeven_bandwidth`), independent of
``n`` once the latency is paid.

System boundary: one request, one link, no overlap with compute, nominal bandwidths and latencies
stated by the caller (:data:`GPU_HBM` and :data:`OFFLOAD_TIERS` hold round figures for one
H100-class server). Units:
bytes, bytes/s, seconds, FLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab._validate import require_int, require_name, require_real
from servelab.kv.footprint import kv_transfer_seconds

__all__ = ["GPU_HBM", "OFFLOAD_TIERS", "OffloadTier", "recompute_seconds",
           "reload_breakeven_bandwidth", "reload_seconds"]


@dataclass(frozen=True)
class OffloadTier:
    """A place KV can wait: ``bandwidth`` bytes/s into device memory, ``latency_s`` per transfer,
    ``capacity_bytes`` the space one server typically has there."""

    name: str
    bandwidth: float
    latency_s: float
    capacity_bytes: float

    def __post_init__(self) -> None:
        require_name("name", self.name)
        require_real("bandwidth", self.bandwidth, 0, strict_min=True)
        require_real("latency_s", self.latency_s, 0)
        require_real("capacity_bytes", self.capacity_bytes, 0, strict_min=True)


GPU_HBM = OffloadTier("GPU HBM (prefix cache)", 3.35e12, 0.0, 8 * 80e9 - 140e9)
"""Device memory itself: a prefix-cache hit there needs no copy at all (the block table points at
the blocks). Capacity: an eight-GPU server of 80 GB H100-class GPUs less a 70B model's bf16
weights."""

OFFLOAD_TIERS = (
    OffloadTier("CPU DRAM over PCIe 5 x16", 50e9, 10e-6, 2e12),
    OffloadTier("local NVMe SSD", 6e9, 100e-6, 8e12),
    OffloadTier("remote store, 100 Gb/s network", 12.5e9, 1e-3, 100e12),
)
"""Round nominal figures for the tiers below device memory of that server: one GPU's PCIe 5 x16
link (achievable host-to-device rate), one NVMe drive's sequential read, a 100 Gb/s NIC; capacities
are typical per server. Illustrative, not measured."""


def reload_seconds(tokens: int, kv_bytes_per_token: int, tier: OffloadTier) -> float:
    """Seconds to copy ``tokens`` tokens of KV from ``tier`` into device memory."""
    m = require_int("kv_bytes_per_token", kv_bytes_per_token, 1)
    if not isinstance(tier, OffloadTier):
        raise ValueError(f"tier must be an OffloadTier, got {type(tier).__name__}")
    return tier.latency_s + kv_transfer_seconds(tokens, m, tier.bandwidth)


def recompute_seconds(tokens: int, params: float, achieved_flops: float) -> float:
    """Seconds to recompute ``tokens`` tokens of KV by prefill: ``2 P n`` FLOPs at
    ``achieved_flops`` FLOP/s (peak x model-FLOP utilisation)."""
    n = require_int("tokens", tokens, 0)
    p = require_real("params", params, 0, strict_min=True)
    f = require_real("achieved_flops", achieved_flops, 0, strict_min=True)
    return 2 * p * n / f


def reload_breakeven_bandwidth(kv_bytes_per_token: int, params: float,
                               achieved_flops: float) -> float:
    """Link bandwidth (bytes/s) above which reloading KV beats recomputing it, latency aside:
    ``m_token / bandwidth < 2 P / achieved FLOP/s``."""
    m = require_int("kv_bytes_per_token", kv_bytes_per_token, 1)
    return m / recompute_seconds(1, params, achieved_flops)
