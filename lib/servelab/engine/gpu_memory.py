"""Sizing the KV pool from GPU memory, the way vLLM's ``gpu_memory_utilization`` does.

The engine may use ``utilization`` of the device's total memory. What the weights (and anything else
already on the device) hold, plus the peak the activations of one profiling forward pass reach,
comes off that budget; the rest becomes whole KV blocks::

    blocks = floor((total_bytes * utilization - used_bytes - activation_peak_bytes) / bytes_per_block)

System boundary: :func:`kv_blocks_for_gpu` is pure arithmetic on byte counts (tested on the CPU with
made-up figures); :func:`measure_cuda_memory` is the only part that asks CUDA
(``torch.cuda.mem_get_info``, ``memory_allocated``, ``max_memory_allocated``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch

from servelab._validate import require_int
from servelab.engine import kv_pool_size

if TYPE_CHECKING:
    from servelab.model.llama import LlamaConfig

__all__ = ["GpuMemory", "kv_block_bytes", "kv_blocks_for_gpu", "measure_cuda_memory"]


def kv_block_bytes(model_config: "LlamaConfig", block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block costs across all layers, K and V: ``2 * L * block_size * kv_heads * d *
    b``."""
    return (2 * model_config.num_hidden_layers * block_size * model_config.num_key_value_heads
            * model_config.head_dim * torch.empty((), dtype=dtype).element_size())


def kv_blocks_for_gpu(
    total_bytes: int,
    utilization: float,
    used_bytes: int,
    activation_peak_bytes: int,
    bytes_per_block: int,
) -> int:
    """How many whole KV blocks fit in ``utilization`` of a device's memory.

    Args:
        total_bytes: the device's total memory, bytes.
        utilization: the fraction of ``total_bytes`` the engine may use, in (0, 1]
            (``EngineConfig.gpu_memory_utilization``, checked there).
        used_bytes: bytes already in use before the KV pool exists: the weights and whatever else
            the device holds (the CUDA context, other engines, other processes).
        activation_peak_bytes: bytes above ``used_bytes`` that the largest forward pass needs at its
            peak.
        bytes_per_block: bytes of one KV block, K and V of every layer.

    Returns:
        The block count, at least 1.

    Raises:
        ValueError: not even one block fits; the message names ``gpu_memory_utilization``, the bytes
            left for the KV cache and the bytes one block needs.
    """
    require_int("total_bytes", total_bytes, 1)
    require_int("used_bytes", used_bytes, 0)
    require_int("activation_peak_bytes", activation_peak_bytes, 0)
    require_int("bytes_per_block", bytes_per_block, 1)
    available = int(total_bytes * utilization) - used_bytes - activation_peak_bytes
    if available < bytes_per_block:
        raise ValueError(
            f"gpu_memory_utilization={utilization} leaves {available} bytes for the KV cache "
            f"({total_bytes} total x {utilization} - {used_bytes} in use - "
            f"{activation_peak_bytes} activation "
            f"peak), but one KV block needs {bytes_per_block} bytes; raise "
            f"gpu_memory_utilization or give "
            "num_blocks"
        )
    return available // bytes_per_block


class GpuMemory(NamedTuple):
    """What :func:`measure_cuda_memory` saw, in bytes."""

    total_bytes: int
    # total - free before profiling: weights, CUDA context, everything else on the device
    used_bytes: int
    # the profiling pass's peak allocation above what was allocated before it
    activation_peak_bytes: int


def measure_cuda_memory(device: torch.device, profile: Callable[[], object]) -> GpuMemory:
    """Run ``profile`` (a forward pass as large as the engine will run) on CUDA ``device`` and
    measure."""
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    profile()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    # hand the profiling pass's activations back before the pool is allocated
    torch.cuda.empty_cache()
    return GpuMemory(total, total - free, peak)
