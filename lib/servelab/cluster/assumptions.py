"""The inputs the cluster calculations share: a device model and the chapter's stated assumptions.

:class:`Accelerator` describes a device by peak FLOP/s and memory bytes/s, enough to time a kernel
against the roofline; :class:`ClusterAssumptions` states once the device, model-FLOP utilisation,
models, context and links that the parallelism and disaggregation calculations use.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab._validate import require_int, require_real
from servelab.metrics.roofline import ModelShape

__all__ = ["Accelerator", "ClusterAssumptions", "require_mfu"]


def require_mfu(mfu: object) -> float:
    """``mfu`` checked as a model-FLOP utilisation: a real number in (0, 1]."""
    return require_real("mfu", mfu, 0, 1, strict_min=True)


@dataclass(frozen=True)
class Accelerator:
    """One device for kernel timing: ``peak_flops`` (FLOP/s) and ``memory_bandwidth`` (bytes/s)."""

    peak_flops: float
    memory_bandwidth: float

    def __post_init__(self) -> None:
        require_real("peak_flops", self.peak_flops, 0, strict_min=True)
        require_real("memory_bandwidth", self.memory_bandwidth, 0, strict_min=True)

    def seconds(self, flops: float, n_bytes: float, mfu: float = 1.0) -> float:
        """Time of a kernel: the slower of computing ``flops`` at ``mfu`` x peak and moving
        ``n_bytes``.

        ``mfu`` 1 is the roofline bound; below 1 it is the model-FLOP utilisation a real kernel
        reaches.
        """
        return max(flops / (self.peak_flops * require_mfu(mfu)), n_bytes / self.memory_bandwidth)


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
    tp_links: tuple[tuple[str, float, float], ...] = (
        ("NVLink-class", 450e9, 2e-6),
        ("PCIe-class", 32e9, 10e-6),
    )
    kv_link_bandwidth: float = 12.5e9
    kv_link_latency_s: float = 1e-4
    decode_streams: int = 4
    chunk_tokens: int = 512

    def __post_init__(self) -> None:
        if not isinstance(self.device, Accelerator):
            raise TypeError(f"device must be an Accelerator, got {type(self.device).__name__}")
        for name in ("large_model", "small_model"):
            if not isinstance(getattr(self, name), ModelShape):
                raise TypeError(
                    f"{name} must be a ModelShape, got {type(getattr(self, name)).__name__}"
                )
        require_mfu(self.mfu)
        for name in ("device_memory_bytes", "target_tokens_per_s", "kv_link_bandwidth"):
            require_real(name, getattr(self, name), 0, strict_min=True)
        require_real("kv_link_latency_s", self.kv_link_latency_s, 0)
        for name in ("context_len", "decode_streams", "chunk_tokens"):
            require_int(name, getattr(self, name), 1)

    def rows(self) -> list[dict[str, str]]:
        """The assumptions as table rows: assumption, value, where the chapter uses it."""
        d, big, small = self.device, self.large_model, self.small_model
        links = "; ".join(
            f"{n} {bw / 1e9:g} GB/s, {lat * 1e6:g} µs per ring step" for n, bw, lat in self.tp_links
        )
        return [
            {
                "assumption": "device",
                "value": f"{self.device_name}: {d.peak_flops / 1e12:g} TFLOP/s bf16 dense, "
                f"{d.memory_bandwidth / 1e12:g} TB/s, {self.device_memory_bytes / 1e9:g} GB",
                "used by": "every table",
            },
            {
                "assumption": "model-FLOP utilisation",
                "value": f"{100 * self.mfu:g} % of peak",
                "used by": "every compute time (time at MFU; memory time at full bandwidth)",
            },
            {"assumption": "large model", "value": _shape_text(big), "used by": "sizing, TP"},
            {"assumption": "small model", "value": _shape_text(small), "used by": "disaggregation"},
            {
                "assumption": "weight formats",
                "value": ", ".join(f"{n} {b:g} B/param" for n, b in self.weight_formats),
                "used by": "sizing",
            },
            {
                "assumption": "one stream's decode rate",
                "value": f"{self.target_tokens_per_s:g} tokens/s",
                "used by": "sizing",
            },
            {
                "assumption": "decode context",
                "value": f"{self.context_len:,} cached tokens per stream",
                "used by": "TP, disaggregation",
            },
            {"assumption": "TP links", "value": links, "used by": "TP"},
            {
                "assumption": "KV link",
                "value": f"{self.kv_link_bandwidth / 1e9:g} GB/s, {self.kv_link_latency_s * 1e3:g} "
                f"ms",
                "used by": "disaggregation",
            },
            {
                "assumption": "co-located decode streams",
                "value": f"{self.decode_streams}",
                "used by": "disaggregation",
            },
            {
                "assumption": "prefill chunk",
                "value": f"{self.chunk_tokens:,} prompt tokens per iteration",
                "used by": "chunked prefill",
            },
        ]


def _shape_text(m: ModelShape) -> str:
    return (f"{m.params / 1e9:g}B parameters, {m.n_layers} layers, hidden {m.hidden_size:,}, "
            f"{m.n_kv_heads} KV heads of {m.head_dim}, {m.bytes_per_elem} B per element")
