"""Prefill/decode disaggregation: ship a prompt's KV cache, or stall the decode streams it shares a
node with.

:func:`disaggregation_estimate` weighs moving a prompt's KV cache from a prefill node to a decode
node (bytes from :func:`servelab.kv.kv_bytes_per_token`) against the decode stall the prefill would
have caused on a node it shared with running streams; :func:`compare_prefill_placements` sets
disaggregation against co-location with and without chunked prefill (:func:`prefill_chunk_cost`).
Times are seconds on an :class:`~servelab.cluster.assumptions.Accelerator` model, links bytes/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab._validate import require_int, require_real
from servelab.cluster.assumptions import Accelerator, require_mfu
from servelab.kv import kv_bytes_per_token
from servelab.metrics.roofline import ModelShape, PhaseCost, decode_cost, prefill_cost

__all__ = [
    "DisaggregationEstimate",
    "PLACEMENTS",
    "PrefillPlacement",
    "colocated_stall_s",
    "compare_prefill_placements",
    "disaggregation_break_even_bandwidth",
    "disaggregation_estimate",
    "prefill_chunk_cost",
]


@dataclass(frozen=True)
class DisaggregationEstimate:
    """One prompt under disaggregation versus colocation (bytes, seconds).

    ``transfer_s`` is added once to this request's TTFT when prefill and decode run on different
    nodes. ``stall_s`` is how much longer the iterations of the ``decode_streams`` co-located
    streams get when the whole prefill shares one of their iterations (mixed-batch time minus
    decode-only time, both at the stated MFU; :func:`compare_prefill_placements` adds the chunked
    case). ``net_s`` counts one second of anyone's delay equally: positive means disaggregating this
    prompt removes more delay than it adds.
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
    """FLOPs and bytes of prefilling prompt tokens ``offset .. offset + chunk_tokens - 1`` in one
    pass.

    FLOPs: 2P per token plus attention over the ``offset`` cached tokens and causally within the
    chunk, 4 x layers x hidden per (query, key) pair. Bytes: the weights, the cached prefix's KV
    read and the chunk's KV written. ``offset`` 0 with the whole prompt is
    :func:`servelab.metrics.roofline.prefill_cost`.
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
    return device.seconds(
        decode.flops + prefill.flops, decode.bytes + prefill.bytes - model.weight_bytes, mfu
    )


def colocated_stall_s(
    model: ModelShape,
    prompt_tokens: int,
    device: Accelerator,
    decode_streams: int,
    decode_context: int,
    mfu: float,
) -> float:
    """Seconds a prefill of ``prompt_tokens`` adds to the iterations of ``decode_streams`` streams
    at ``decode_context`` tokens each: time of the mixed batch minus that of decode alone, FLOPs at
    ``mfu`` of the device's peak.

    The weights are read once for the mixed batch, so a short prompt rides almost free on a
    memory-bound decode step.
    """
    pre = prefill_cost(model, prompt_tokens)
    if decode_streams == 0:
        return _mixed_iteration_s(model, device, mfu, None, pre)
    dec = decode_cost(model, decode_context, decode_streams)
    return _mixed_iteration_s(model, device, mfu, dec, pre) - device.seconds(
        dec.flops, dec.bytes, mfu
    )


def disaggregation_estimate(
    model: ModelShape,
    prompt_tokens: int,
    device: Accelerator,
    link_bandwidth: float,
    link_latency_s: float,
    decode_streams: int,
    decode_context: int = 1024,
    mfu: float = 0.5,
) -> DisaggregationEstimate:
    """Weigh shipping a prompt's KV to a decode node against the stall its prefill causes when
    colocated.

    KV bytes: ``prompt_tokens x`` :func:`servelab.kv.kv_bytes_per_token` of ``model``. Transfer:
    ``link_latency_s + kv_bytes / link_bandwidth`` (bytes/s; no overlap with the prefill assumed).
    Stall: :func:`colocated_stall_s`, from :func:`servelab.metrics.roofline.prefill_cost` and
    ``decode_cost`` on ``device`` at model-FLOP utilisation ``mfu`` (0 < mfu <= 1).
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
    u = require_mfu(mfu)
    kv = p * kv_bytes_per_token(
        model.n_layers, model.n_kv_heads, model.head_dim, model.bytes_per_elem
    )
    stall = colocated_stall_s(model, p, device, streams, ctx, u)
    return DisaggregationEstimate(p, kv, lat + kv / bw, stall, streams)


def disaggregation_break_even_bandwidth(
    model: ModelShape,
    prompt_tokens: int,
    device: Accelerator,
    link_latency_s: float,
    decode_streams: int,
    decode_context: int = 1024,
    mfu: float = 0.5,
) -> float:
    """Link bandwidth (bytes/s) above which disaggregating the prompt removes more delay than it
    adds.

    ``inf`` when the saved stall does not even cover the link latency (no bandwidth is enough).
    """
    probe = disaggregation_estimate(
        model, prompt_tokens, device, 1.0, link_latency_s, decode_streams, decode_context, mfu
    )
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


def _chunked_iterations(
    model: ModelShape,
    prompt_tokens: int,
    chunk_tokens: int,
    device: Accelerator,
    mfu: float,
    decode: PhaseCost,
) -> list[float]:
    """Seconds of each iteration that carries one prefill chunk next to the decode batch."""
    return [_mixed_iteration_s(model, device, mfu, decode,
                               prefill_chunk_cost(model, o, min(chunk_tokens, prompt_tokens - o)))
            for o in range(0, prompt_tokens, chunk_tokens)]


def compare_prefill_placements(
    model: ModelShape,
    prompt_tokens: int,
    device: Accelerator,
    *,
    decode_streams: int,
    decode_context: int,
    mfu: float,
    chunk_tokens: int,
    link_bandwidth: float,
    link_latency_s: float,
) -> tuple[PrefillPlacement, ...]:
    """One prompt's prefill three ways, on ``device`` at model-FLOP utilisation ``mfu``:

    * co-located: the whole prompt joins one iteration of the ``decode_streams`` streams;
    * co-located, chunked: ``chunk_tokens`` prompt tokens per iteration next to the streams, each
      chunk attending to the chunks before it;
    * disaggregated: a prefill node runs it alone, then its KV crosses the link (latency + bytes /
      ``link_bandwidth``) before decoding; the decode node's iterations stay decode-only.

    Decode streams hold ``decode_context`` cached tokens each (their growth during the prefill is
    ignored).
    """
    streams = require_int("decode_streams", decode_streams, 1)
    est = disaggregation_estimate(
        model, prompt_tokens, device, link_bandwidth, link_latency_s, streams, decode_context, mfu
    )
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
