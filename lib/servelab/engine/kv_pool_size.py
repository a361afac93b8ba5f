"""How many KV blocks the pool gets when the configuration leaves it open, and how the engine
reports it.

An explicit ``EngineConfig.num_blocks`` wins, then an explicit ``kv_cache_memory_bytes``. Otherwise
the pool is sized from the memory there is, as vLLM does:

* **CUDA**: ``gpu_memory_utilization`` (0.9 when unset, vLLM's default) of the device's total
  memory, less what the device already holds (weights, context, other engines) and the activation
  peak of one profiling forward pass (:mod:`servelab.engine.gpu_memory`);
* **CPU**: :data:`CPU_KV_FRACTION` of the memory the OS reports as available (``MemAvailable`` in
  ``/proc/meminfo``), at most :data:`CPU_KV_CAP_BYTES`. vLLM's CPU backend takes
  ``VLLM_CPU_KVCACHE_SPACE`` GiB; unset, it used a fixed 4 GiB (vLLM 0.6-0.9) and now takes half of
  the node's total memory. The course follows the fraction (of *available* memory, since a laptop or
  a shared machine runs other things) and keeps the old 4 GiB as a cap.

Either way the pool never gets more blocks than ``max_num_seqs`` sequences of ``max_model_len``
tokens can hold at once (:func:`max_useful_blocks`). This is where the course departs from vLLM,
which allocates the whole budget: the running set can never need more, extra blocks would only keep
more prefix-cache entries alive, and a notebook or a test suite that builds dozens of engines on a
small model would otherwise allocate gigabytes each. On the CPU the pool's pages are zero pages of
the OS until a K/V write touches them (:class:`~servelab.engine.model_runner.KVCache`), so even a 4
GiB pool costs only what it holds.

System boundary: byte and block counts; :func:`available_memory_bytes` is the only part that asks
the OS.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from servelab._validate import require_int, require_interval

__all__ = ["CPU_KV_CAP_BYTES", "CPU_KV_FRACTION", "DEFAULT_GPU_MEMORY_UTILIZATION", "PoolSize",
           "available_memory_bytes", "kv_blocks_for_cpu", "max_useful_blocks"]

CPU_KV_FRACTION = 0.5
"""Share of the available host memory the KV pool may take on a CPU (vLLM's CPU default
utilization)."""
CPU_KV_CAP_BYTES = 4 * 2**30
"""At most this many bytes of KV pool on a CPU by default: vLLM's former ``VLLM_CPU_KVCACHE_SPACE``
default."""
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's default ``gpu_memory_utilization``, used on CUDA when no size is given."""


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Host memory the OS can give without swapping, bytes: ``MemAvailable`` from ``meminfo``, else
    ``psutil.virtual_memory().available`` where ``/proc`` is absent (macOS, Windows)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        pass
    import psutil

    return int(psutil.virtual_memory().available)


def kv_blocks_for_cpu(available_bytes: int, bytes_per_block: int, fraction: float = CPU_KV_FRACTION,
                      cap_bytes: int = CPU_KV_CAP_BYTES) -> int:
    """Whole blocks of ``bytes_per_block`` in ``min(available_bytes * fraction, cap_bytes)``, at
    least 1."""
    require_int("available_bytes", available_bytes, 0)
    require_int("bytes_per_block", bytes_per_block, 1)
    require_interval("fraction", fraction, 0.0, 1.0, low_open=True)
    require_int("cap_bytes", cap_bytes, 1)
    return max(1, min(int(available_bytes * fraction), cap_bytes) // bytes_per_block)


def max_useful_blocks(max_num_seqs: int, max_model_len: int, block_size: int) -> int:
    """Blocks that ``max_num_seqs`` sequences of ``max_model_len`` tokens fill: more can never be in
    use."""
    return max_num_seqs * -(-max_model_len // block_size)


class PoolSize(NamedTuple):
    """The KV pool as an operator reads it: ``num_blocks`` of ``block_size`` tokens,
    ``bytes_per_block`` bytes each (K and V of every layer), for requests of up to ``max_model_len``
    tokens, on a device of ``device_type`` (torch's name: ``"cpu"``, ``"cuda"``)."""

    num_blocks: int
    block_size: int
    bytes_per_block: int
    max_model_len: int
    device_type: str = "cpu"

    @property
    def tokens(self) -> int:
        """Token slots in the pool."""
        return self.num_blocks * self.block_size

    @property
    def bytes(self) -> int:
        """The pool's size in bytes."""
        return self.num_blocks * self.bytes_per_block

    def max_concurrency(self, tokens_per_request: int | None = None) -> float:
        """How many requests of ``tokens_per_request`` tokens (default ``max_model_len``) the pool
        holds at once, counted in whole blocks per request as vLLM counts it."""
        tokens = self.max_model_len if tokens_per_request is None else tokens_per_request
        require_int("tokens_per_request", tokens, 1)
        return self.num_blocks / -(-tokens // self.block_size)

    def describe(self) -> str:
        """vLLM's start-up line: ``# GPU blocks: N, maximum concurrency for X tokens per request:
        Y``."""
        device = "GPU" if self.device_type == "cuda" else self.device_type.upper()
        return (
            f"# {device} blocks: {self.num_blocks} ({self.tokens} tokens, "
            f"{self.bytes / 2**20:.1f} MiB), "
            f"maximum concurrency for {self.max_model_len} tokens per request: "
            f"{self.max_concurrency():.2f}x"
        )
