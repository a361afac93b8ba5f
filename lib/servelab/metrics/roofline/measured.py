"""This machine's roofline, measured: read bandwidth, peak matmul FLOP/s and the cost of one
operator.

A decode step cannot be faster than the slowest of three floors:

* **memory**: the bytes it must read (every weight once, plus each sequence's cached K and V)
  divided by the read bandwidth (:func:`measure_read_bandwidth`, a STREAM-like ``sum`` over a tensor
  far larger than the caches);
* **compute**: its FLOPs divided by the peak matmul rate in its dtype
  (:func:`measure_matmul_flops`);
* **overhead**: the operators it dispatches (:func:`count_ops`) times the cost of one empty operator
  (:func:`measure_op_overhead`): the Python and dispatcher work that no kernel speeds up.

:meth:`Roofline.floor` takes the maximum and names the bound; :meth:`StepFloor.fraction_of` says how
close a measured step came to it (1.0 = at the floor). The ridge point (peak FLOP/s over bandwidth,
FLOP/byte) is the arithmetic intensity where a kernel stops being memory-bound.

System boundary: this process, on the CPU, with torch's current thread count. Each probe repeats for
a short time budget (a few hundred milliseconds) and reports the **median** repeat, so one burst of
other load on a shared machine moves it little. Units: bytes/s, FLOP/s, seconds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from servelab._validate import require_int, require_real
from servelab.metrics.roofline import analytic
from servelab.metrics.roofline.analytic import ModelShape, decode_cost

Clock = Callable[[], float]
"""Seconds, as :func:`time.perf_counter` (wall clock, the default) or :func:`time.thread_time` (CPU
seconds of the calling thread: other processes on a shared machine do not inflate it, but it sees
only the work on this thread, so use it with ``torch.set_num_threads(1)``)."""

__all__ = [
    "Clock",
    "Roofline",
    "StepFloor",
    "count_ops",
    "decode_floor",
    "measure_matmul_flops",
    "measure_op_overhead",
    "measure_read_bandwidth",
    "measure_roofline",
    "median_seconds",
    "model_shape",
]


def median_seconds(fn: Callable[[], object], budget_s: float = 0.3, min_repeats: int = 3,
                   max_repeats: int = 10_000, clock: Clock = time.perf_counter) -> float:
    """Median seconds of ``fn()`` on ``clock`` over as many repeats as ``budget_s`` (wall clock)
    allows (one warm-up call first; at least ``min_repeats``, at most ``max_repeats``)."""
    budget = require_real("budget_s", budget_s, 0.0, strict_min=True)
    low = require_int("min_repeats", min_repeats, minimum=1)
    high = require_int("max_repeats", max_repeats, minimum=low)
    fn()
    times: list[float] = []
    deadline = time.perf_counter() + budget
    while len(times) < low or (time.perf_counter() < deadline and len(times) < high):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def measure_read_bandwidth(
    nbytes: int = 256 << 20, budget_s: float = 0.3, clock: Clock = time.perf_counter
) -> float:
    """Read bandwidth in bytes/s: ``sum`` over a float32 tensor of ``nbytes`` (reads every byte
    once, writes one number). Use a tensor much larger than the last-level cache (the default is 256
    MiB)."""
    count = require_int("nbytes", nbytes, minimum=4) // 4
    data = torch.ones(count, dtype=torch.float32)
    return count * 4 / median_seconds(data.sum, budget_s, clock=clock)


def measure_matmul_flops(
    dtype: torch.dtype = torch.float32,
    size: int = 1024,
    budget_s: float = 0.3,
    clock: Clock = time.perf_counter,
) -> float:
    """Peak matmul rate in FLOP/s: ``size x size`` by ``size x size`` in ``dtype`` (``2 * size**3``
    FLOPs), large enough to be compute-bound on a CPU."""
    n = require_int("size", size, minimum=16)
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch dtype, got {dtype}")
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(0)).to(dtype)
    b = torch.randn(n, n, generator=torch.Generator().manual_seed(1)).to(dtype)
    return 2 * n ** 3 / median_seconds(lambda: a @ b, budget_s, clock=clock)


def measure_op_overhead(
    budget_s: float = 0.2, batch: int = 100, clock: Clock = time.perf_counter
) -> float:
    """Seconds of one empty operator: an in-place add of 0 to a one-element tensor, called ``batch``
    times per timed repeat (a single call is too short to time), so all that is left is dispatch."""
    calls = require_int("batch", batch, minimum=1)
    x = torch.zeros(1)

    def run() -> None:
        for _ in range(calls):
            x.add_(0.0)

    return median_seconds(run, budget_s, clock=clock) / calls


class _OpCounter(TorchDispatchMode):
    """Counts every ATen operator dispatched while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> int:
    """How many ATen operators one call of ``fn`` dispatches (views and in-place ops included)."""
    with _OpCounter() as counter:
        fn()
    return counter.count


@dataclass(frozen=True)
class StepFloor:
    """The three floors of one step, in seconds; the step cannot beat the largest."""

    memory_s: float
    compute_s: float
    overhead_s: float

    @property
    def seconds(self) -> float:
        """The floor: ``max(memory, compute, overhead)``."""
        return max(self.memory_s, self.compute_s, self.overhead_s)

    @property
    def bound(self) -> str:
        """Which floor is highest: ``"memory"``, ``"compute"`` or ``"overhead"``."""
        floors = {"memory": self.memory_s, "compute": self.compute_s, "overhead": self.overhead_s}
        return max(floors, key=floors.get)

    def fraction_of(self, measured_s: float) -> float:
        """Floor over a measured step time: 1.0 means the step ran at its floor, 0.25 four times
        slower."""
        return self.seconds / require_real("measured_s", measured_s, 0.0, strict_min=True)


@dataclass(frozen=True)
class Roofline:
    """One machine's measured ceilings: ``read_bandwidth`` bytes/s, ``peak_flops`` FLOP/s per dtype
    name (``"float32"``, ``"bfloat16"``), ``op_overhead_s`` seconds per operator, at ``threads``
    threads."""

    read_bandwidth: float
    peak_flops: dict[str, float]
    op_overhead_s: float
    threads: int

    def _peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise ValueError(f"dtype must be one of {sorted(self.peak_flops)}, got {dtype!r}")
        return self.peak_flops[dtype]

    def ridge_point(self, dtype: str = "float32") -> float:
        """FLOP per byte where the compute roof meets the memory roof."""
        return analytic.ridge_point(self._peak(dtype), self.read_bandwidth)

    def attainable(self, intensity: float, dtype: str = "float32") -> float:
        """The roof at ``intensity`` FLOP/byte: ``min(peak, intensity x bandwidth)`` FLOP/s."""
        return analytic.attainable_flops(intensity, self._peak(dtype), self.read_bandwidth)

    def floor(
        self, bytes_moved: float, flops: float, ops: int, dtype: str = "float32"
    ) -> StepFloor:
        """The floors of a step that reads ``bytes_moved`` bytes, does ``flops`` FLOPs in ``dtype``
        and dispatches ``ops`` operators."""
        moved = require_real("bytes_moved", bytes_moved, 0.0)
        work = require_real("flops", flops, 0.0)
        count = require_int("ops", ops, minimum=0)
        return StepFloor(
            moved / self.read_bandwidth, work / self._peak(dtype), count * self.op_overhead_s
        )

    def to_dict(self) -> dict:
        """JSON-ready, with the ridge point per dtype."""
        return {
            "read_bandwidth_bytes_per_s": self.read_bandwidth,
            "peak_flops": dict(self.peak_flops),
            "op_overhead_s": self.op_overhead_s,
            "threads": self.threads,
            "ridge_point_flop_per_byte": {d: self.ridge_point(d) for d in self.peak_flops},
        }


def measure_roofline(
    budget_s: float = 0.3,
    bandwidth_bytes: int = 256 << 20,
    matmul_size: int = 1024,
    clock: Clock = time.perf_counter,
) -> Roofline:
    """All three probes at torch's current thread count, timed on ``clock`` (about ``4 * budget_s``
    seconds in all, more where one bfloat16 matmul of ``matmul_size`` alone takes longer than
    ``budget_s``)."""
    return Roofline(
        read_bandwidth=measure_read_bandwidth(bandwidth_bytes, budget_s, clock),
        peak_flops={
            name: measure_matmul_flops(dtype, matmul_size, budget_s, clock)
            for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))
        },
        op_overhead_s=measure_op_overhead(budget_s * 2 / 3, clock=clock),
        threads=torch.get_num_threads(),
    )


def model_shape(model: torch.nn.Module) -> ModelShape:
    """The roofline shape of a :class:`~servelab.model.llama.LlamaForCausalLM`: its distinct
    parameters (a tied embedding counts once: the LM head reads it whole) in its weights' dtype."""
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    weight = next(model.parameters())
    return ModelShape(
        params=params,
        n_layers=cfg.num_hidden_layers,
        hidden_size=cfg.num_attention_heads * cfg.head_dim,
        n_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        bytes_per_elem=weight.element_size(),
    )


def decode_floor(
    model: torch.nn.Module, roofline: Roofline, context_len: int, batch: int, ops: int
) -> StepFloor:
    """The floors of one decode step of ``model`` with ``batch`` sequences of ``context_len`` cached
    tokens that dispatches ``ops`` operators (bytes and FLOPs from
    :func:`servelab.metrics.roofline.decode_cost`)."""
    cost = decode_cost(model_shape(model), context_len, batch)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return roofline.floor(
        cost.bytes, cost.flops, ops, dtype if dtype in roofline.peak_flops else "float32"
    )
