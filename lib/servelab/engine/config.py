"""Engine configuration: every knob the scheduler, KV cache and model runner read, validated once.

System boundary: plain values only. Nothing here touches the model or the device; the model runner
turns ``num_blocks``, ``kv_cache_memory_bytes`` or the memory there is
(:mod:`servelab.engine.kv_pool_size`) into a block pool, the scheduler reads the budgets.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab._validate import require_int, require_interval, require_real, require_type
from servelab.engine.spec_config import SpeculativeConfig, speculative_config
from servelab.scheduling.queue_policy import ENGINE_POLICIES

PREEMPTION_MODES = ("recompute", "swap")
# the rules of servelab.engine.admission.RESERVATIONS
RESERVATION_POLICIES = ("on-demand", "up-front", "per-step")


@dataclass(frozen=True)
class EngineConfig:
    """Knobs of one :class:`~servelab.engine.LLMEngine`.

    Attributes:
        block_size: tokens per KV block (the paging granularity).
        num_blocks: physical KV blocks in the device pool; ``None`` sizes the pool from
            ``kv_cache_memory_bytes`` if given, else from the memory there is
            (:mod:`servelab.engine.kv_pool_size`: on CUDA ``gpu_memory_utilization``, on a CPU half
            the available memory up to 4 GiB; either at most ``max_num_seqs`` sequences of
            ``max_model_len``).
        kv_cache_memory_bytes: memory budget (bytes) for K and V of all layers when ``num_blocks``
            is None; ``None`` (the default) sizes the pool from the memory there is.
        gpu_memory_utilization: fraction in (0, 1] of the CUDA device's total memory the engine may
            use for weights, activations and KV cache (vLLM's knob; ``None`` means vLLM's 0.9). On
            CUDA, with ``num_blocks`` and ``kv_cache_memory_bytes`` None, the pool gets every whole
            block that fits in ``total x fraction`` minus what the device already holds minus the
            peak of one profiling forward pass of ``max_num_batched_tokens`` tokens
            (:mod:`servelab.engine.gpu_memory`); too small a fraction for one block is a ValueError.
            On the CPU it has no effect beyond validation.
        max_num_seqs: most sequences in one forward pass (batch slots).
        max_num_batched_tokens: per-iteration token budget shared by prefill chunks and decode
            tokens.
        enable_chunked_prefill: split a long prompt over several iterations when it exceeds the
            budget left in this iteration; off, a prompt is prefilled in one iteration or waits.
        enable_prefix_caching: reuse the KV of identical full-block token prefixes across requests.
        preemption_mode: ``"recompute"`` (drop the KV, prefill again later) or ``"swap"`` (copy the
            KV to host memory and back).
        swap_space_bytes: host memory (bytes) for swapped-out KV; when full, preemption recomputes.
        policy: queue order and victim choice, a name in
            ``servelab.scheduling.queue_policy.ENGINE_POLICIES``: ``"fcfs"`` (arrival),
            ``"priority"`` (lower value first, then arrival), ``"sjf"`` (fewest tokens left under
            ``max_tokens`` first), ``"sjf-aging"`` (SJF, less ``aging_rate`` tokens per scheduler
            tick waited since the request was queued) or ``"fair-queuing"`` (the tenant with the
            fewest tokens sampled so far first, FCFS within a tenant; ``add_request(tenant=...)``).
            Running and swapped sequences follow the key of
            ``servelab.scheduling.queue_policy.running_key``.
        aging_rate: tokens of rank one scheduler tick of waiting earns under ``"sjf-aging"`` (>= 0).
        reservation_policy: the admission rule, a name in :data:`RESERVATION_POLICIES` (see
            ``servelab.engine.admission``): ``"on-demand"`` (reserve the uncached
            prompt blocks, grow block by block, preempt under pressure) or ``"up-front"`` (reserve
            prompt + ``max_tokens`` blocks at admission, never preempt), both the course's model; or
            ``"per-step"`` (vLLM V1: reserve nothing, allocate the blocks of the tokens each step
            schedules, a prefill chunk or a decode token, and preempt under pressure).
        max_model_len: context limit in tokens (prompt + output); ``None`` uses the model's
            ``max_position_embeddings``.
        device: torch device string; ``None`` keeps the model where it is (``from_pretrained``,
            which loads the model itself, follows :func:`servelab.device.pick_device`: the
            ``SERVELAB_DEVICE`` variable, else CUDA when available, else CPU).
        dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"``; ``None`` keeps the model's dtype
            (``from_pretrained``: ``pick_device``, i.e. ``SERVELAB_DTYPE``, else bf16 on CUDA, fp32
            on CPU).
        seed: seeds the generator that draws a seed for each request that has none.
        trace_steps: tracing: keep a :class:`~servelab.engine.trace.StepRecord` of each of the last
            ``trace_steps`` steps in ``LLMEngine.trace`` (a ring buffer). 0, the default, turns
            tracing off and costs nothing per step; a notebook or test that reads the trace asks for
            it.
        ledger_size: terminal records kept in ``LLMEngine.ledger`` (a window of the most recent
            ones; its totals stay exact over every request). A new request id is refused while a
            request with it is live or among these last ``ledger_size`` ended ones; older ids are
            forgotten (memory stays flat).
        speculative_config: speculative decoding, vLLM's dict (``{"method": "ngram",
            "num_speculative_tokens": k, ...}`` or ``{"method": "draft_model", "model": ..., ...}``,
            see :mod:`servelab.engine.spec_config`), stored checked as a ``SpeculativeConfig``; None
            (the default): one token per decoding request per step.
        batch_invariant: a request's logits, and so its tokens and logprobs, do not depend on what
            else is in the batch (:mod:`servelab.engine.batch_invariant`: weight matmuls and
            norms on fixed row tiles, attention per token), at a cost in speed; False (the
            default): the fastest kernel for each batch shape, whose reduction order follows it.
    """

    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    preemption_mode: str = "recompute"
    swap_space_bytes: int = 256 * 2**20
    policy: str = "fcfs"
    aging_rate: float = 1.0
    reservation_policy: str = "on-demand"
    max_model_len: int | None = None
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    trace_steps: int = 0
    ledger_size: int = 10_000
    speculative_config: SpeculativeConfig | dict | None = None
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            require_int(name, getattr(self, name), 1)
        for name in ("num_blocks", "max_model_len", "kv_cache_memory_bytes"):
            if getattr(self, name) is not None:
                require_int(name, getattr(self, name), 1)
        if self.gpu_memory_utilization is not None:
            require_interval(
                "gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, low_open=True
            )
        for name in ("swap_space_bytes", "trace_steps", "ledger_size"):
            require_int(name, getattr(self, name), 0)
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "batch_invariant"):
            require_type(name, getattr(self, name), bool)
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}"
            )
        if self.policy not in ENGINE_POLICIES:
            raise ValueError(f"policy must be one of {ENGINE_POLICIES}, got {self.policy!r}")
        require_real("aging_rate", self.aging_rate, 0)
        if self.reservation_policy not in RESERVATION_POLICIES:
            raise ValueError(f"reservation_policy must be one of {RESERVATION_POLICIES}, "
                             f"got {self.reservation_policy!r}")
        self._plain_device_and_dtype()
        if self.device is not None and not isinstance(self.device, str):
            raise TypeError(
                f"device must be a str such as 'cpu' or 'cuda' or None, got {self.device!r}"
            )
        if self.dtype not in (None, "float32", "float16", "bfloat16"):
            raise ValueError(
                f"dtype must be None, 'float32', 'float16' or 'bfloat16', got {self.dtype!r}"
            )
        require_int("seed", self.seed)
        object.__setattr__(self, "speculative_config", speculative_config(self.speculative_config))

    def _plain_device_and_dtype(self) -> None:
        """Store a ``torch.device`` / ``torch.dtype`` (what :func:`servelab.device.pick_device`
        returns) as its plain name, so ``EngineConfig(device=DEVICE, dtype=DTYPE)`` works with a
        notebook's set-up."""
        if type(self.device).__name__ == "device" and type(self.device).__module__ == "torch":
            object.__setattr__(self, "device", str(self.device))
        if type(self.dtype).__name__ == "dtype" and type(self.dtype).__module__ == "torch":
            object.__setattr__(self, "dtype", str(self.dtype).removeprefix("torch."))
