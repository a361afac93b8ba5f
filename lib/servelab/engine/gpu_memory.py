"""Sizing the KV pool from GPU memory, the way vLLM's ``gpu_memory_utilization`` does.

The engine may use ``utilization`` of the device's total memory. What the weights (and anything else already
on the device) hold, plus the peak the activations of one profiling forward pass reach, comes off that
budget; the rest becomes whole KV blocks::

    blocks = floor((total_bytes * utilization - used_bytes - activation_peak_bytes) / bytes_per_block)

System boundary: :func:`kv_blocks_for_gpu` is pure arithmetic on byte counts (tested on the CPU with made-up
figures); :func:`measure_cuda_memory` is the only part that asks CUDA (``torch.cuda.mem_get_info``,
``memory_allocated``, ``max_memory_allocated``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch

from servelab._validate import require_int, require_interval
from servelab.engine import kv_pool_size

if TYPE_CHECKING:
    from servelab.engine.config import EngineConfig
    from servelab.engine.model_runner import ModelRunner
    from servelab.model.llama import LlamaConfig

__all__ = ["GpuMemory", "kv_block_bytes", "kv_blocks_for_gpu", "measure_cuda_memory", "pool_blocks",
           "blocks_from_gpu_memory"]


def kv_block_bytes(model_config: "LlamaConfig", block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block costs across all layers, K and V: ``2 * L * block_size * kv_heads * d * b``."""
    return (2 * model_config.num_hidden_layers * block_size * model_config.num_key_value_heads
            * model_config.head_dim * torch.empty((), dtype=dtype).element_size())


def kv_blocks_for_gpu(total_bytes: int, utilization: float, used_bytes: int, activation_peak_bytes: int,
                      bytes_per_block: int) -> int:
    """How many whole KV blocks fit in ``utilization`` of a device's memory.

    Args:
        total_bytes: the device's total memory, bytes.
        utilization: the fraction of ``total_bytes`` the engine may use, in (0, 1]
            (``EngineConfig.gpu_memory_utilization``).
        used_bytes: bytes already in use before the KV pool exists: the weights and whatever else the device
            holds (the CUDA context, other engines, other processes).
        activation_peak_bytes: bytes above ``used_bytes`` that the largest forward pass needs at its peak.
        bytes_per_block: bytes of one KV block, K and V of every layer.

    Returns:
        The block count, at least 1.

    Raises:
        ValueError: not even one block fits; the message names ``gpu_memory_utilization``, the bytes left
            for the KV cache and the bytes one block needs.
    """
    require_int("total_bytes", total_bytes, 1)
    require_interval("gpu_memory_utilization", utilization, 0.0, 1.0, low_open=True)
    require_int("used_bytes", used_bytes, 0)
    require_int("activation_peak_bytes", activation_peak_bytes, 0)
    require_int("bytes_per_block", bytes_per_block, 1)
    available = int(total_bytes * utilization) - used_bytes - activation_peak_bytes
    if available < bytes_per_block:
        raise ValueError(
            f"gpu_memory_utilization={utilization} leaves {available} bytes for the KV cache "
            f"({total_bytes} total x {utilization} - {used_bytes} in use - {activation_peak_bytes} activation "
            f"peak), but one KV block needs {bytes_per_block} bytes; raise gpu_memory_utilization or give "
            "num_blocks")
    return available // bytes_per_block


class GpuMemory(NamedTuple):
    """What :func:`measure_cuda_memory` saw, in bytes."""

    total_bytes: int
    used_bytes: int  # total - free before profiling: weights, CUDA context, everything else on the device
    activation_peak_bytes: int  # the profiling pass's peak allocation above what was allocated before it


def measure_cuda_memory(device: torch.device, profile: Callable[[], object]) -> GpuMemory:
    """Run ``profile`` (a forward pass as large as the engine will run) on CUDA ``device`` and measure."""
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    profile()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    torch.cuda.empty_cache()  # hand the profiling pass's activations back before the pool is allocated
    return GpuMemory(total, total - free, peak)


def pool_blocks(runner: "ModelRunner", config: "EngineConfig", max_model_len: int) -> int:
    """Blocks for a pool whose size ``config.num_blocks`` leaves open (:mod:`servelab.engine.kv_pool_size`):
    as many as an explicit ``config.kv_cache_memory_bytes`` pays for (``runner.bytes_per_block = 2 * layers *
    block_size * kv_heads * head_dim * bytes_per_element``); else on CUDA what :func:`blocks_from_gpu_memory`
    finds (all of it when ``gpu_memory_utilization`` is set), on a CPU a share of the available memory; by
    default at most what ``max_num_seqs`` sequences of ``max_model_len`` tokens fill."""
    if config.kv_cache_memory_bytes is not None:
        return max(1, config.kv_cache_memory_bytes // runner.bytes_per_block)
    if runner.device.type == "cuda":
        blocks = blocks_from_gpu_memory(runner, config)
        if config.gpu_memory_utilization is not None:  # asked for by name: all of it, as vLLM does
            return blocks
    else:
        blocks = kv_pool_size.kv_blocks_for_cpu(kv_pool_size.available_memory_bytes(), runner.bytes_per_block)
    return min(blocks, kv_pool_size.max_useful_blocks(config.max_num_seqs, max_model_len, config.block_size))


def blocks_from_gpu_memory(runner: "ModelRunner", config: "EngineConfig") -> int:
    """Profile one forward pass of ``max_num_batched_tokens`` tokens (one sequence from position 0, its last
    ``max_num_seqs`` rows through the LM head) over a pool just large enough, then size the real pool from
    what the device has left (:func:`kv_blocks_for_gpu`)."""
    from servelab.engine.model_runner import ChunkSpan, ForwardInput, KVCache, PagedAttention

    cfg = runner.model.config
    tokens = min(config.max_num_batched_tokens, config.max_model_len or cfg.max_position_embeddings)
    blocks = -(-tokens // config.block_size)
    rows = min(config.max_num_seqs, tokens)
    batch = ForwardInput(token_ids=[0] * tokens, positions=list(range(tokens)),
                         spans=[ChunkSpan(0, tokens, list(range(blocks)))],
                         sample_indices=list(range(tokens - rows, tokens)))

    def profile() -> None:
        runner.backend = PagedAttention(KVCache(cfg.num_hidden_layers, blocks, config.block_size,
                                                cfg.num_key_value_heads, cfg.head_dim, runner.dtype, runner.device))
        runner.execute(batch)
        del runner.backend

    seen = measure_cuda_memory(runner.device, profile)
    utilization = config.gpu_memory_utilization or kv_pool_size.DEFAULT_GPU_MEMORY_UTILIZATION
    return kv_blocks_for_gpu(seen.total_bytes, utilization, seen.used_bytes,
                             seen.activation_peak_bytes, runner.bytes_per_block)
