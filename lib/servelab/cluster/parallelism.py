"""Parallelism arithmetic for the inference forward pass (no backward pass, no optimizer state).

Tensor parallelism (TP) splits every layer's matmuls over ``t`` devices and pays two all-reduces of
the activations per layer (after the attention output projection and after the MLP down
projection); :func:`ring_allreduce_bytes` is the bytes each rank sends in a ring all-reduce and
:func:`tp_decode_step` sets the communication time against the compute a decode step saves.
Pipeline parallelism (PP) splits the layers into ``p`` stages; :func:`pp_bubble_fraction` and
:func:`pipeline_schedule` show the idle share when ``m`` micro-batches flow through. Expert
parallelism (EP) places the experts of a mixture-of-experts layer on ``e`` ranks;
:func:`ep_all_to_all_bytes` counts the dispatch and combine traffic of top-k routing and
:func:`expert_rank_loads` the imbalance that skewed routing causes.

These are models, not measurements: links are bytes/s and a per-message latency in seconds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from servelab._validate import require_int, require_real
from servelab.cluster.assumptions import Accelerator
from servelab.metrics.roofline import ModelShape, decode_cost

__all__ = [
    "ALLREDUCE_ALGORITHMS",
    "EPTraffic",
    "allreduce_seconds",
    "TPStep",
    "ep_all_to_all_bytes",
    "expert_rank_loads",
    "pipeline_schedule",
    "pp_bubble_fraction",
    "ring_allreduce_bytes",
    "tp_allreduce_message_bytes",
    "tp_decode_step",
]


# --------------------------------------------------------------------------------------------------
# tensor parallelism
# --------------------------------------------------------------------------------------------------


def ring_allreduce_bytes(message_bytes: float, world_size: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``message_bytes``: ``2(t-1)/t *
    M``.

    The ring runs a reduce-scatter then an all-gather, each ``t - 1`` steps of ``M / t`` bytes. With
    ``world_size`` 1 nothing moves.
    """
    m = require_real("message_bytes", message_bytes, 0)
    t = require_int("world_size", world_size, 1)
    return 2 * (t - 1) / t * m


def tp_allreduce_message_bytes(hidden_size: int, bytes_per_elem: int, tokens: int = 1) -> int:
    """All-reduce payload of one transformer layer under TP, in bytes: ``2 * tokens * hidden *
    bytes``.

    Two all-reduces per layer (after the row-parallel attention output projection and after the
    row-parallel MLP down projection), each of the ``tokens x hidden_size`` activations.
    """
    h = require_int("hidden_size", hidden_size, 1)
    b = require_int("bytes_per_elem", bytes_per_elem, 1)
    n = require_int("tokens", tokens, 1)
    return 2 * n * h * b


@dataclass(frozen=True)
class TPStep:
    """One decode step of a batch under TP degree ``tp`` (seconds).

    ``compute_s`` is one rank's time for its ``1/tp`` share of weights, KV and FLOPs (at the MFU
    asked for); ``comm_s`` the all-reduce time over all layers; ``sent_bytes`` what each rank sends
    per step.
    """

    tp: int
    compute_s: float
    comm_s: float
    sent_bytes: float

    @property
    def total_s(self) -> float:
        """Step time with no overlap of communication and compute (the pessimistic bound)."""
        return self.compute_s + self.comm_s


ALLREDUCE_ALGORITHMS = ("ring", "one-shot")
"""How :func:`tp_decode_step` times an all-reduce: ``"ring"`` (the course's model, ``2(t-1)`` link
latencies and :func:`ring_allreduce_bytes`) or ``"one-shot"`` (every rank reads every peer's whole
message at once over an all-to-all fabric such as NVLink: one link latency, ``(t-1) M`` bytes
received per rank), the shape of custom all-reduce kernels and NCCL's low-latency protocols for the
small messages of decode, whose latency is nearly flat in ``t``."""


def allreduce_seconds(message_bytes: float, world_size: int, link_bandwidth: float,
                      link_latency_s: float, algorithm: str = "ring") -> float:
    """Seconds of one all-reduce of ``message_bytes`` over ``world_size`` ranks (0 for one rank)."""
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALLREDUCE_ALGORITHMS}, got {algorithm!r}")
    m = require_real("message_bytes", message_bytes, 0)
    t = require_int("world_size", world_size, 1)
    bw = require_real("link_bandwidth", link_bandwidth, 0, strict_min=True)
    lat = require_real("link_latency_s", link_latency_s, 0)
    if t == 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (t - 1) * lat + ring_allreduce_bytes(m, t) / bw
    return lat + (t - 1) * m / bw


def tp_decode_step(model: ModelShape, tp: int, device: Accelerator, link_bandwidth: float,
                   link_latency_s: float, batch: int = 1, context_len: int = 1024, mfu: float = 1.0,
                   allreduce: str = "ring") -> TPStep:
    """Time one decode step of ``batch`` sequences at ``context_len`` tokens on ``tp`` ranks.

    Compute: :func:`servelab.metrics.roofline.decode_cost` split evenly over the ranks, timed on
    ``device`` at model-FLOP utilisation ``mfu`` (1 = the roofline bound).
    Communication: per layer two all-reduces of ``batch x hidden`` activations, timed by
    :func:`allreduce_seconds` with ``allreduce`` (``"ring"``: each of the ``2(t-1)`` ring steps
    costs ``link_latency_s`` plus its bytes over ``link_bandwidth``, bytes/s per rank).
    """
    if not isinstance(model, ModelShape):
        raise TypeError(f"model must be a ModelShape, got {type(model).__name__}")
    if not isinstance(device, Accelerator):
        raise TypeError(f"device must be an Accelerator, got {type(device).__name__}")
    t = require_int("tp", tp, 1)
    bw = require_real("link_bandwidth", link_bandwidth, 0, strict_min=True)
    lat = require_real("link_latency_s", link_latency_s, 0)
    cost = decode_cost(model, context_len, batch)
    compute = device.seconds(cost.flops / t, cost.bytes / t, mfu)
    # one of the layer's two all-reduces
    per_allreduce = batch * model.hidden_size * model.bytes_per_elem
    sent_per_allreduce = (ring_allreduce_bytes(per_allreduce, t) if allreduce == "ring"
                          else (t - 1) * per_allreduce)
    n_allreduce = 2 * model.n_layers
    comm = n_allreduce * allreduce_seconds(per_allreduce, t, bw, lat, allreduce)
    return TPStep(t, compute, comm, n_allreduce * sent_per_allreduce)


# --------------------------------------------------------------------------------------------------
# pipeline parallelism
# --------------------------------------------------------------------------------------------------


def pp_bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle share of a pipeline flush: ``(p - 1) / (m + p - 1)`` for ``p`` stages, ``m``
    micro-batches.

    Each stage is busy ``m`` of the ``m + p - 1`` slots it takes the last micro-batch to leave the
    last stage (equal stage times, forward pass only).
    """
    p = require_int("stages", stages, 1)
    m = require_int("microbatches", microbatches, 1)
    return (p - 1) / (m + p - 1)


def pipeline_schedule(stages: int, microbatches: int) -> list[list[int | None]]:
    """Forward-only pipeline schedule: ``grid[stage][slot]`` is the micro-batch that stage runs, or
    None.

    Micro-batch ``j`` is on stage ``s`` in slot ``s + j``; there are ``m + p - 1`` slots.
    """
    p = require_int("stages", stages, 1)
    m = require_int("microbatches", microbatches, 1)
    slots = m + p - 1
    return [[slot - s if 0 <= slot - s < m else None for slot in range(slots)] for s in range(p)]


# --------------------------------------------------------------------------------------------------
# expert parallelism
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EPTraffic:
    """All-to-all bytes of one MoE layer, summed over ranks: dispatch (tokens out) and combine
    (back)."""

    dispatch_bytes: float
    combine_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.dispatch_bytes + self.combine_bytes


def ep_all_to_all_bytes(
    tokens: int, hidden_size: int, bytes_per_elem: int, top_k: int, ep: int
) -> EPTraffic:
    """Expected all-to-all traffic of one MoE layer for ``tokens`` tokens routed top-``k`` over
    ``ep`` ranks.

    Each token's hidden vector goes to each of its ``k`` experts and the expert outputs come back.
    With experts spread evenly and routing uniform, a destination is on another rank with
    probability ``(ep - 1) / ep``; only those copies cross the network.
    """
    n = require_int("tokens", tokens, 1)
    h = require_int("hidden_size", hidden_size, 1)
    b = require_int("bytes_per_elem", bytes_per_elem, 1)
    k = require_int("top_k", top_k, 1)
    e = require_int("ep", ep, 1)
    one_way = n * k * h * b * (e - 1) / e
    return EPTraffic(one_way, one_way)


def expert_rank_loads(tokens: int, num_experts: int, top_k: int, ep: int, skew: float,
                      seed: int = 0) -> list[int]:
    """Token-expert assignments each EP rank receives when ``tokens`` tokens pick ``top_k`` distinct
    experts with Zipf-like popularity ``1 / rank**skew`` (``skew`` 0 = uniform). Experts are placed
    round-robin on ``ep`` ranks; drawn from ``random.Random(seed)``."""
    n = require_int("tokens", tokens, 1)
    x = require_int("num_experts", num_experts, 1)
    k = require_int("top_k", top_k, 1)
    if k > x:
        raise ValueError(f"top_k must be <= num_experts ({x}), got {k}")
    e = require_int("ep", ep, 1)
    if x % e:
        raise ValueError(f"ep must divide num_experts ({x}), got {e}")
    s = require_real("skew", skew, 0)
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** s for i in range(x)]
    loads = [0] * e
    for _ in range(n):
        chosen: set[int] = set()
        while len(chosen) < k:
            chosen.add(rng.choices(range(x), weights)[0])
        for expert in chosen:
            loads[expert % e] += 1
    return loads
