"""From one engine to a cluster: parallelism arithmetic, prefill/decode disaggregation, multi-LoRA serving.

Three halves, all for the inference forward pass only (no backward pass, no optimizer state):

*Parallelism calculators.* Tensor parallelism (TP) splits every layer's matmuls over ``t`` devices and
pays two all-reduces of the activations per layer (after the attention output projection and after the
MLP down projection); :func:`ring_allreduce_bytes` is the bytes each rank sends in a ring all-reduce and
:func:`tp_decode_step` sets the communication time against the compute a decode step saves. Pipeline
parallelism (PP) splits the layers into ``p`` stages; :func:`pp_bubble_fraction` and
:func:`pipeline_schedule` show the idle share when ``m`` micro-batches flow through. Expert
parallelism (EP) places the experts of a mixture-of-experts layer on ``e`` ranks; :func:`ep_all_to_all_bytes`
counts the dispatch and combine traffic of top-k routing and :func:`expert_rank_loads` the imbalance that
skewed routing causes.

*Disaggregation.* :func:`disaggregation_estimate` weighs moving a prompt's KV cache from a prefill node
to a decode node (bytes from :func:`servelab.kv.kv_bytes_per_token`) against the decode stall the prefill
would have caused on a node it shared with running streams; :func:`compare_prefill_placements` sets
disaggregation against co-location with and without chunked prefill (:func:`prefill_chunk_cost`).

:class:`ClusterAssumptions` holds the inputs these calculations share (device, model-FLOP
utilisation, models, context, links), so a chapter states them once.

*Multi-LoRA.* :class:`AdapterRegistry` (the trusted control plane), :class:`GpuAdapterCache` (adapter
slots with per-request references; LRU eviction of unreferenced adapters only) and
:func:`simulate_adapter_serving`, which runs the cache-miss loading sequence for a stream of requests:
resolve and verify the digest -> bounded host (CPU) cache -> reserve a GPU adapter slot -> transfer ->
bind the request to that adapter version -> release on completion or cancellation.

System boundary: these are models, not measurements. Devices are described by peak FLOP/s and memory
bytes/s (:class:`Accelerator`), links by bytes/s and a per-message latency in seconds; the adapter
simulation runs in milliseconds of simulated time on one replica and never touches tensors.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from servelab._validate import require_int, require_real
from servelab.kv import kv_bytes_per_token
from servelab.metrics import ModelShape, PhaseCost, decode_cost, prefill_cost

__all__ = [
    "Accelerator",
    "ClusterAssumptions",
    "AdapterArtifact",
    "AdapterKey",
    "AdapterRecord",
    "AdapterRegistry",
    "AdapterRequest",
    "AdapterSimResult",
    "DigestMismatch",
    "DisaggregationEstimate",
    "EPTraffic",
    "GpuAdapterCache",
    "HostAdapterCache",
    "IncompatibleAdapter",
    "LoadCosts",
    "NoEvictableAdapter",
    "TPStep",
    "adapter_workload",
    "PLACEMENTS",
    "PrefillPlacement",
    "colocated_stall_s",
    "compare_prefill_placements",
    "disaggregation_break_even_bandwidth",
    "disaggregation_estimate",
    "ep_all_to_all_bytes",
    "expert_rank_loads",
    "pipeline_schedule",
    "pp_bubble_fraction",
    "prefill_chunk_cost",
    "ring_allreduce_bytes",
    "sha256_hex",
    "simulate_adapter_serving",
    "tp_allreduce_message_bytes",
    "tp_decode_step",
]


# --------------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------------


def _mfu(mfu: object) -> float:
    return require_real("mfu", mfu, 0, 1, strict_min=True)


# --------------------------------------------------------------------------------------------------
# tensor parallelism
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Accelerator:
    """One device for kernel timing: ``peak_flops`` (FLOP/s) and ``memory_bandwidth`` (bytes/s)."""

    peak_flops: float
    memory_bandwidth: float

    def __post_init__(self) -> None:
        require_real("peak_flops", self.peak_flops, 0, strict_min=True)
        require_real("memory_bandwidth", self.memory_bandwidth, 0, strict_min=True)

    def seconds(self, flops: float, n_bytes: float, mfu: float = 1.0) -> float:
        """Time of a kernel: the slower of computing ``flops`` at ``mfu`` x peak and moving ``n_bytes``.

        ``mfu`` 1 is the roofline bound; below 1 it is the model-FLOP utilisation a real kernel reaches.
        """
        return max(flops / (self.peak_flops * _mfu(mfu)), n_bytes / self.memory_bandwidth)


@dataclass(frozen=True)
class ClusterAssumptions:
    """The inputs the cluster chapter's calculations share, stated once.

    Device: ``device`` (peak FLOP/s, memory bytes/s; datasheet figures used as model inputs) with
    ``device_memory_bytes`` of memory, its FLOPs run at model-FLOP utilisation ``mfu``. Models: a
    ``large_model`` (sizing, TP) and a ``small_model`` (disaggregation), sized in each of
    ``weight_formats`` (name, bytes per parameter) and for one stream at ``target_tokens_per_s``.
    Decode streams hold ``context_len`` cached tokens. Links: ``tp_links`` as (name, bytes/s per
    rank, seconds per ring step); the KV link of disaggregation ``kv_link_bandwidth`` bytes/s plus
    ``kv_link_latency_s``, next to ``decode_streams`` streams, or ``chunk_tokens`` per chunk.
    """

    device_name: str = "H100-class"
    device: Accelerator = Accelerator(989e12, 3.35e12)
    device_memory_bytes: float = 80e9
    mfu: float = 0.5
    large_model: ModelShape = ModelShape(70_000_000_000, 80, 8192, 8, 128, 2)
    small_model: ModelShape = ModelShape(8_000_000_000, 32, 4096, 8, 128, 2)
    weight_formats: tuple[tuple[str, float], ...] = (("FP16", 2), ("INT4", 0.5))
    target_tokens_per_s: float = 40
    context_len: int = 1024
    tp_links: tuple[tuple[str, float, float], ...] = (("NVLink-class", 450e9, 2e-6), ("PCIe-class", 32e9, 10e-6))
    kv_link_bandwidth: float = 12.5e9
    kv_link_latency_s: float = 1e-4
    decode_streams: int = 4
    chunk_tokens: int = 512

    def __post_init__(self) -> None:
        if not isinstance(self.device, Accelerator):
            raise TypeError(f"device must be an Accelerator, got {type(self.device).__name__}")
        for name in ("large_model", "small_model"):
            if not isinstance(getattr(self, name), ModelShape):
                raise TypeError(f"{name} must be a ModelShape, got {type(getattr(self, name)).__name__}")
        _mfu(self.mfu)
        for name in ("device_memory_bytes", "target_tokens_per_s", "kv_link_bandwidth"):
            require_real(name, getattr(self, name), 0, strict_min=True)
        require_real("kv_link_latency_s", self.kv_link_latency_s, 0)
        for name in ("context_len", "decode_streams", "chunk_tokens"):
            require_int(name, getattr(self, name), 1)

    def rows(self) -> list[dict[str, str]]:
        """The assumptions as table rows: assumption, value, where the chapter uses it."""
        d, big, small = self.device, self.large_model, self.small_model
        links = "; ".join(f"{n} {bw / 1e9:g} GB/s, {lat * 1e6:g} µs per ring step" for n, bw, lat in self.tp_links)
        return [
            {"assumption": "device", "value": f"{self.device_name}: {d.peak_flops / 1e12:g} TFLOP/s bf16 dense, "
             f"{d.memory_bandwidth / 1e12:g} TB/s, {self.device_memory_bytes / 1e9:g} GB", "used by": "every table"},
            {"assumption": "model-FLOP utilisation", "value": f"{100 * self.mfu:g} % of peak",
             "used by": "every compute time (time at MFU; memory time at full bandwidth)"},
            {"assumption": "large model", "value": _shape_text(big), "used by": "sizing, TP"},
            {"assumption": "small model", "value": _shape_text(small), "used by": "disaggregation"},
            {"assumption": "weight formats", "value": ", ".join(f"{n} {b:g} B/param" for n, b in self.weight_formats),
             "used by": "sizing"},
            {"assumption": "one stream's decode rate", "value": f"{self.target_tokens_per_s:g} tokens/s", "used by": "sizing"},
            {"assumption": "decode context", "value": f"{self.context_len:,} cached tokens per stream",
             "used by": "TP, disaggregation"},
            {"assumption": "TP links", "value": links, "used by": "TP"},
            {"assumption": "KV link", "value": f"{self.kv_link_bandwidth / 1e9:g} GB/s, {self.kv_link_latency_s * 1e3:g} ms",
             "used by": "disaggregation"},
            {"assumption": "co-located decode streams", "value": f"{self.decode_streams}", "used by": "disaggregation"},
            {"assumption": "prefill chunk", "value": f"{self.chunk_tokens:,} prompt tokens per iteration",
             "used by": "chunked prefill"},
        ]


def _shape_text(m: ModelShape) -> str:
    return (f"{m.params / 1e9:g}B parameters, {m.n_layers} layers, hidden {m.hidden_size:,}, "
            f"{m.n_kv_heads} KV heads of {m.head_dim}, {m.bytes_per_elem} B per element")


def ring_allreduce_bytes(message_bytes: float, world_size: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``message_bytes``: ``2(t-1)/t * M``.

    The ring runs a reduce-scatter then an all-gather, each ``t - 1`` steps of ``M / t`` bytes. With
    ``world_size`` 1 nothing moves.
    """
    m = require_real("message_bytes", message_bytes, 0)
    t = require_int("world_size", world_size, 1)
    return 2 * (t - 1) / t * m


def tp_allreduce_message_bytes(hidden_size: int, bytes_per_elem: int, tokens: int = 1) -> int:
    """All-reduce payload of one transformer layer under TP, in bytes: ``2 * tokens * hidden * bytes``.

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

    ``compute_s`` is one rank's time for its ``1/tp`` share of weights, KV and FLOPs (at the MFU asked for);
    ``comm_s`` the all-reduce time over all layers; ``sent_bytes`` what each rank sends per step.
    """

    tp: int
    compute_s: float
    comm_s: float
    sent_bytes: float

    @property
    def total_s(self) -> float:
        """Step time with no overlap of communication and compute (the pessimistic bound)."""
        return self.compute_s + self.comm_s


def tp_decode_step(model: ModelShape, tp: int, device: Accelerator, link_bandwidth: float,
                   link_latency_s: float, batch: int = 1, context_len: int = 1024, mfu: float = 1.0) -> TPStep:
    """Time one decode step of ``batch`` sequences at ``context_len`` tokens on ``tp`` ranks.

    Compute: :func:`servelab.metrics.decode_cost` split evenly over the ranks, timed on ``device``
    at model-FLOP utilisation ``mfu`` (1 = the roofline bound).
    Communication: per layer two ring all-reduces of ``batch x hidden`` activations; each ring step
    costs ``link_latency_s`` plus its bytes over ``link_bandwidth`` (bytes/s per rank).
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
    per_allreduce = batch * model.hidden_size * model.bytes_per_elem  # one of the layer's two all-reduces
    sent_per_allreduce = ring_allreduce_bytes(per_allreduce, t)
    n_allreduce = 2 * model.n_layers
    ring_steps = 2 * (t - 1)
    comm = n_allreduce * (ring_steps * lat + sent_per_allreduce / bw) if t > 1 else 0.0
    return TPStep(t, compute, comm, n_allreduce * sent_per_allreduce)


# --------------------------------------------------------------------------------------------------
# pipeline parallelism
# --------------------------------------------------------------------------------------------------


def pp_bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle share of a pipeline flush: ``(p - 1) / (m + p - 1)`` for ``p`` stages, ``m`` micro-batches.

    Each stage is busy ``m`` of the ``m + p - 1`` slots it takes the last micro-batch to leave the
    last stage (equal stage times, forward pass only).
    """
    p = require_int("stages", stages, 1)
    m = require_int("microbatches", microbatches, 1)
    return (p - 1) / (m + p - 1)


def pipeline_schedule(stages: int, microbatches: int) -> list[list[int | None]]:
    """Forward-only pipeline schedule: ``grid[stage][slot]`` is the micro-batch that stage runs, or None.

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
    """All-to-all bytes of one MoE layer, summed over ranks: dispatch (tokens out) and combine (back)."""

    dispatch_bytes: float
    combine_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.dispatch_bytes + self.combine_bytes


def ep_all_to_all_bytes(tokens: int, hidden_size: int, bytes_per_elem: int, top_k: int, ep: int) -> EPTraffic:
    """Expected all-to-all traffic of one MoE layer for ``tokens`` tokens routed top-``k`` over ``ep`` ranks.

    Each token's hidden vector goes to each of its ``k`` experts and the expert outputs come back. With
    experts spread evenly and routing uniform, a destination is on another rank with probability
    ``(ep - 1) / ep``; only those copies cross the network.
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


# --------------------------------------------------------------------------------------------------
# prefill/decode disaggregation
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DisaggregationEstimate:
    """One prompt under disaggregation versus colocation (bytes, seconds).

    ``transfer_s`` is added once to this request's TTFT when prefill and decode run on different
    nodes. ``stall_s`` is how much longer the iterations of the ``decode_streams`` co-located streams
    get when the whole prefill shares one of their iterations (mixed-batch time minus decode-only
    time, both at the stated MFU; :func:`compare_prefill_placements` adds the chunked case). ``net_s`` counts one
    second of anyone's delay equally: positive means disaggregating this prompt removes more delay
    than it adds.
    """

    prompt_tokens: int
    kv_bytes: int
    transfer_s: float
    stall_s: float
    decode_streams: int

    @property
    def saved_s(self) -> float:
        """Decode delay removed, summed over the co-located streams."""
        return self.decode_streams * self.stall_s

    @property
    def net_s(self) -> float:
        return self.saved_s - self.transfer_s

    @property
    def worth_it(self) -> bool:
        return self.net_s > 0


def prefill_chunk_cost(model: ModelShape, offset: int, chunk_tokens: int) -> PhaseCost:
    """FLOPs and bytes of prefilling prompt tokens ``offset .. offset + chunk_tokens - 1`` in one pass.

    FLOPs: 2P per token plus attention over the ``offset`` cached tokens and causally within the
    chunk, 4 x layers x hidden per (query, key) pair. Bytes: the weights, the cached prefix's KV read
    and the chunk's KV written. ``offset`` 0 with the whole prompt is :func:`servelab.metrics.prefill_cost`.
    """
    if not isinstance(model, ModelShape):
        raise TypeError(f"model must be a ModelShape, got {type(model).__name__}")
    o = require_int("offset", offset, 0)
    c = require_int("chunk_tokens", chunk_tokens, 1)
    pairs = c * o + c * (c + 1) // 2
    flops = 2 * model.params * c + 4 * model.n_layers * model.hidden_size * pairs
    return PhaseCost(flops, model.weight_bytes + (o + c) * model.kv_bytes_per_token)


def _mixed_iteration_s(model: ModelShape, device: Accelerator, mfu: float, decode: PhaseCost | None,
                       prefill: PhaseCost) -> float:
    """One iteration carrying ``prefill`` and, if any, the ``decode`` streams: weights read once."""
    if decode is None:
        return device.seconds(prefill.flops, prefill.bytes, mfu)
    return device.seconds(decode.flops + prefill.flops, decode.bytes + prefill.bytes - model.weight_bytes, mfu)


def colocated_stall_s(model: ModelShape, prompt_tokens: int, device: Accelerator, decode_streams: int,
                      decode_context: int, mfu: float) -> float:
    """Seconds a prefill of ``prompt_tokens`` adds to the iterations of ``decode_streams`` streams at
    ``decode_context`` tokens each: time of the mixed batch minus that of decode alone, FLOPs at
    ``mfu`` of the device's peak.

    The weights are read once for the mixed batch, so a short prompt rides almost free on a
    memory-bound decode step.
    """
    pre = prefill_cost(model, prompt_tokens)
    if decode_streams == 0:
        return _mixed_iteration_s(model, device, mfu, None, pre)
    dec = decode_cost(model, decode_context, decode_streams)
    return _mixed_iteration_s(model, device, mfu, dec, pre) - device.seconds(dec.flops, dec.bytes, mfu)


def disaggregation_estimate(model: ModelShape, prompt_tokens: int, device: Accelerator, link_bandwidth: float,
                            link_latency_s: float, decode_streams: int, decode_context: int = 1024,
                            mfu: float = 0.5) -> DisaggregationEstimate:
    """Weigh shipping a prompt's KV to a decode node against the stall its prefill causes when colocated.

    KV bytes: ``prompt_tokens x`` :func:`servelab.kv.kv_bytes_per_token` of ``model``. Transfer:
    ``link_latency_s + kv_bytes / link_bandwidth`` (bytes/s; no overlap with the prefill assumed).
    Stall: :func:`colocated_stall_s`, from :func:`servelab.metrics.prefill_cost` and ``decode_cost``
    on ``device`` at model-FLOP utilisation ``mfu`` (0 < mfu <= 1).
    """
    if not isinstance(model, ModelShape):
        raise TypeError(f"model must be a ModelShape, got {type(model).__name__}")
    if not isinstance(device, Accelerator):
        raise TypeError(f"device must be an Accelerator, got {type(device).__name__}")
    p = require_int("prompt_tokens", prompt_tokens, 1)
    bw = require_real("link_bandwidth", link_bandwidth, 0, strict_min=True)
    lat = require_real("link_latency_s", link_latency_s, 0)
    streams = require_int("decode_streams", decode_streams, 0)
    ctx = require_int("decode_context", decode_context, 1)
    u = _mfu(mfu)
    kv = p * kv_bytes_per_token(model.n_layers, model.n_kv_heads, model.head_dim, model.bytes_per_elem)
    stall = colocated_stall_s(model, p, device, streams, ctx, u)
    return DisaggregationEstimate(p, kv, lat + kv / bw, stall, streams)


def disaggregation_break_even_bandwidth(model: ModelShape, prompt_tokens: int, device: Accelerator,
                                        link_latency_s: float, decode_streams: int, decode_context: int = 1024,
                                        mfu: float = 0.5) -> float:
    """Link bandwidth (bytes/s) above which disaggregating the prompt removes more delay than it adds.

    ``inf`` when the saved stall does not even cover the link latency (no bandwidth is enough).
    """
    probe = disaggregation_estimate(model, prompt_tokens, device, 1.0, link_latency_s, decode_streams,
                                    decode_context, mfu)
    margin = probe.saved_s - link_latency_s
    return probe.kv_bytes / margin if margin > 0 else math.inf


@dataclass(frozen=True)
class PrefillPlacement:
    """What one prompt's prefill costs the new request and the decode streams it meets (seconds).

    ``ttft_s``: from the start of the prefill to the first token, the KV transfer included when
    disaggregated. ``worst_gap_s``: the longest iteration the decode streams wait through meanwhile,
    their worst inter-token latency. ``stream_delay_s``: the decode time lost, summed over the
    streams, against iterations of decode alone. ``iterations``: passes the prefill takes.
    """

    strategy: str
    iterations: int
    ttft_s: float
    worst_gap_s: float
    stream_delay_s: float


PLACEMENTS = ("co-located", "co-located, chunked", "disaggregated")


def _chunked_iterations(model: ModelShape, prompt_tokens: int, chunk_tokens: int, device: Accelerator,
                        mfu: float, decode: PhaseCost) -> list[float]:
    """Seconds of each iteration that carries one prefill chunk next to the decode batch."""
    return [_mixed_iteration_s(model, device, mfu, decode,
                               prefill_chunk_cost(model, o, min(chunk_tokens, prompt_tokens - o)))
            for o in range(0, prompt_tokens, chunk_tokens)]


def compare_prefill_placements(model: ModelShape, prompt_tokens: int, device: Accelerator, *, decode_streams: int,
                               decode_context: int, mfu: float, chunk_tokens: int, link_bandwidth: float,
                               link_latency_s: float) -> tuple[PrefillPlacement, ...]:
    """One prompt's prefill three ways, on ``device`` at model-FLOP utilisation ``mfu``:

    * co-located: the whole prompt joins one iteration of the ``decode_streams`` streams;
    * co-located, chunked: ``chunk_tokens`` prompt tokens per iteration next to the streams, each
      chunk attending to the chunks before it;
    * disaggregated: a prefill node runs it alone, then its KV crosses the link (latency + bytes /
      ``link_bandwidth``) before decoding; the decode node's iterations stay decode-only.

    Decode streams hold ``decode_context`` cached tokens each (their growth during the prefill is ignored).
    """
    streams = require_int("decode_streams", decode_streams, 1)
    est = disaggregation_estimate(model, prompt_tokens, device, link_bandwidth, link_latency_s, streams,
                                  decode_context, mfu)
    c = require_int("chunk_tokens", chunk_tokens, 1)
    dec = decode_cost(model, decode_context, streams)
    alone = device.seconds(dec.flops, dec.bytes, mfu)
    whole = alone + est.stall_s
    chunks = _chunked_iterations(model, prompt_tokens, c, device, mfu, dec)
    pre = prefill_cost(model, prompt_tokens)
    solo = device.seconds(pre.flops, pre.bytes, mfu)
    return (
        PrefillPlacement(PLACEMENTS[0], 1, whole, whole, est.saved_s),
        PrefillPlacement(PLACEMENTS[1], len(chunks), sum(chunks), max(chunks),
                         streams * (sum(chunks) - len(chunks) * alone)),
        PrefillPlacement(PLACEMENTS[2], 1, solo + est.transfer_s, alone, 0.0),
    )


# --------------------------------------------------------------------------------------------------
# multi-LoRA: identity, registry, caches
# --------------------------------------------------------------------------------------------------


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

    ``name`` is the alias tenants ask for; it is a label, not part of the identity (two versions of one
    alias are two cache entries, and so are two bases). The same key salts the prefix cache
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

    ``size_bytes`` is the adapter's tensor size used for timing; ``payload`` stands in for its content
    (what the digest is checked against); ``published_ms`` is when the version became resolvable.
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
    """Trusted control plane: publishes adapter versions; serving only resolves authorised aliases."""

    def __init__(self) -> None:
        self._versions: dict[str, list[AdapterArtifact]] = {}

    def publish(self, name: str, version: int, base_model: str, size_bytes: int, payload: bytes | None = None,
                published_ms: float = 0.0, digest: str | None = None) -> AdapterArtifact:
        """Register a version. ``payload`` defaults to bytes derived from name and version; ``digest``
        defaults to its SHA-256 (pass another to model a corrupted or tampered artifact)."""
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
        """Step 1: the newest version of ``name`` published by ``at_ms``, checked for base compatibility
        and for bytes matching the published digest."""
        live = [a for a in self._versions.get(name, []) if a.published_ms <= at_ms]
        if not live:
            raise KeyError(f"adapter {name!r} has no version published by t={at_ms} ms")
        artifact = live[-1]
        if artifact.base_model != base_model:
            raise IncompatibleAdapter(f"adapter {artifact.key.label()} targets base {artifact.base_model!r}, "
                                      f"this replica serves {base_model!r}")
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
        """Store ``key`` (if it fits at all), evicting least recently used entries; returns the evicted."""
        evicted = []
        if size_bytes > self.capacity_bytes:
            return evicted
        self._entries[key] = size_bytes
        self._entries.move_to_end(key)
        while self.used_bytes > self.capacity_bytes:
            evicted.append(self._entries.popitem(last=False)[0])
        return evicted


class GpuAdapterCache:
    """``capacity`` GPU adapter slots. Each resident adapter counts the in-flight requests bound to it.

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
                raise NoEvictableAdapter(f"all {self.capacity} adapter slots have in-flight requests")
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


# --------------------------------------------------------------------------------------------------
# multi-LoRA: the serving simulation
# --------------------------------------------------------------------------------------------------


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
    """A generation request naming an adapter alias. Times in ms: ``service_ms`` is model compute once
    admitted (adapter loading excluded); ``cancel_after_ms`` (after arrival) models a client that
    goes away; ``deadline_ms`` (after arrival) is the latest admission the request accepts."""

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
    """One request's outcome. ``status``: finished, cancelled, timed_out or failed. ``gpu_hit``: its adapter
    was resident and loaded at admission; ``load_ms``: cold-load delay (hashing, fetch, transfer), kept
    apart from ``service_ms``; ``steps``: the loading sequence as (step, detail) pairs."""

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
        sim.records[req.request_id] = AdapterRecord(req.request_id, req.adapter, None, "failed", req.arrival_ms,
                                                    None, None, now, False, False, 0.0,
                                                    (("1 resolve+verify", str(error)),))
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
        steps.append(("3 reserve", "free slot" if victim is None else f"evicted {victim.label()} (0 refs)"))
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
    record = AdapterRecord(req.request_id, req.adapter, key, status, req.arrival_ms, now, start, end, gpu_hit,
                           host_hit, start - now if not gpu_hit else 0.0, tuple(steps))
    sim.push(end, "end", record)
    return True


def _dispatch(sim: _Sim, now: float) -> None:
    """Admit from the head of the FIFO queue while batch slots last and the head can get its adapter."""
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
        sim.records[req.request_id] = AdapterRecord(req.request_id, req.adapter, None, status, req.arrival_ms,
                                                    None, None, at, False, False, 0.0, ())


def simulate_adapter_serving(requests: Sequence[AdapterRequest], registry: AdapterRegistry, base_model: str,
                             gpu_slots: int, host_bytes: int, max_running: int,
                             costs: LoadCosts) -> AdapterSimResult:
    """Serve ``requests`` on one replica of ``base_model`` with ``gpu_slots`` adapter slots, a host cache of
    ``host_bytes`` bytes and ``max_running`` concurrent requests, FIFO admission.

    Admission runs the loading sequence (module docstring). A request whose adapter is resident binds
    at once (joining a load still in flight); otherwise it needs a free slot or an adapter with no
    references to evict, else it waits at the head of the queue. It releases its batch slot and adapter
    reference when it finishes or is cancelled. A queued request whose deadline passes times out;
    one whose adapter fails to resolve or verify fails without touching either cache.
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
    sim = _Sim(registry, base_model, GpuAdapterCache(gpu_slots), HostAdapterCache(host_bytes), costs,
               require_int("max_running", max_running, 1))
    for req in requests:
        sim.push(req.arrival_ms, "arrive", req)
    while sim.events:
        now, _, kind, payload = heapq.heappop(sim.events)
        if kind == "arrive":
            sim.queue.append(payload)
        else:
            sim.free_slots += 1
            released = sim.gpu.release(payload.key, payload.request_id)
            release = ("6 release", f"{payload.status}: reference dropped" if released else "no reference held")
            sim.records[payload.request_id] = replace(payload, steps=payload.steps + (release,))
        _dispatch(sim, now)
    return AdapterSimResult(tuple(sim.records[r.request_id] for r in requests), sim.cold_loads,
                            sim.storage_fetches, tuple(sim.evictions))


def adapter_workload(num_requests: int, adapters: Sequence[str], *, mean_gap_ms: float, service_ms: float,
                     skew: float, cancel_share: float = 0.0, seed: int = 0) -> list[AdapterRequest]:
    """Poisson arrivals (mean gap ``mean_gap_ms``) choosing adapters with popularity ``1 / rank**skew``;
    service times exponential around ``service_ms``; a share ``cancel_share`` of clients cancel after a
    uniform fraction of their service time. Drawn from ``random.Random(seed)``."""
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
