"""Batch-invariant inference: a request's logits do not depend on what else is in the batch.

**What breaks it.** Floating-point addition is not associative, so a sum's last bits depend on the
order of its terms. A kernel picks its reduction order from the shape it is given: a matmul of 1 row
runs as a GEMV, of 8 rows as a small GEMM with another blocking, of 64 as yet another; the attention
of a batch of decode rows pads every row's keys to the longest context and splits them by that
length. The batch's shape is set by whoever else is being served, so a request's logits move in the
last bits with its neighbours, and a near-tie between two tokens can flip: greedy output then
depends on load.

**What this mode fixes** (``EngineConfig(batch_invariant=True)``; the model runner enters it for
each forward pass):

* every weight matmul (``F.linear``, and :mod:`servelab.engine.cpu_linear`'s oneDNN linear, whose
  kernel picks its blocking by the row count) and every RMSNorm runs on **fixed tiles of
  ``TILE_ROWS`` rows**, the last tile padded with zero rows: every call has the same shape, so the
  same kernel and the same reduction order, whatever the batch. A row's place inside a tile and the
  other rows in it do not change its result in the kernels measured here (the tests check it);
* **attention runs per token** (:func:`attend_rowwise`): each new token attends alone to exactly the
  keys it may see, so its reduction over the keys, and the kernel's split of it, depend on its own
  context length only, not on the batch's longest context nor on where a prefill chunk began.
  Prefill, chunked prefill, decode, prefix-cache hits and recomputation all give the same numbers;
* the sampler and the logprobs need nothing: every reduction they make is over one row's vocabulary
  (softmax, log-softmax, cumulative sum, argmax, in float64) and each sampling row draws from its
  own generator (:mod:`servelab.engine.sampler`).

**What it costs.** The batch no longer shares a weight read as one GEMM: a step of ``n`` rows makes
``ceil(n / TILE_ROWS)`` calls per weight matrix, a lone row pays for a whole tile, and attention
makes one call per token and layer instead of one per sequence. The §1 notebook measures the
slowdown on this CPU. vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``) keeps the batch
instead: it replaces torch's kernels through ``torch.library`` (from Thinking Machines'
``batch_invariant_ops``) with ones that reduce each row in one program whatever the row count
(RMSNorm, softmax, log-softmax, mean), keeps cuBLAS with split-K turned off on Hopper and Blackwell
(a workspace too small for it), uses a Triton matmul with one tile configuration on Ampere, and
gives attention a fixed KV split size; SGLang's ``--enable-deterministic-inference`` fixes the split
size too and cuts chunked prefill at multiples of it. Their reported cost is tens of percent, not a
factor.

**What it does not fix.** Invariance to the batch, not to everything: another CPU, torch or oneDNN
version, precision, thread count or tensor-parallel layout still changes the numbers. Elementwise
functions (SiLU's exponential, RoPE's sine) have no reduction, but a CPU kernel computes the last
partial SIMD vector of a buffer in scalar code, which can round differently; with rows whose widths
are whole vectors (SmolLM2's 576, 1536 and 64; the tiny model's 192, 512 and 32) no row lands in
such a tail. On CUDA the same tiles and
per-token calls apply; this course's build has no GPU to check them on.

System boundary: a context (:class:`BatchInvariantMode`) around one forward pass, and the attention
of one sequence's new tokens over its gathered keys; no state outlives the forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from servelab.sampling.params import SamplingParams

__all__ = ["TILE_ROWS", "BatchInvariantMode", "RequestNumbers", "attend_rowwise",
           "first_difference", "run_together", "tiled_rows"]

TILE_ROWS = 16
"""Rows per matmul / RMSNorm call in batch-invariant mode: every call has exactly this many (a
partly filled tile is padded with zero rows). 16 covers a decode step of up to 16 sequences in
one call."""

def tiled_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
               tile_rows: int = TILE_ROWS) -> torch.Tensor:
    """``fn`` applied to ``x`` (``[*lead, features]``) as tiles of exactly ``tile_rows`` rows of
    ``features``, the last one padded with zero rows; returns ``[*lead, out_features]`` (also for no
    rows). ``fn`` must act on each row independently (a linear layer, a norm over the last dim)."""
    if tile_rows < 1:
        raise ValueError(f"tile_rows must be a positive integer, got {tile_rows!r}")
    rows = x.reshape(-1, x.shape[-1])
    count = rows.shape[0]
    padded_count = max(tile_rows, -(-count // tile_rows) * tile_rows)  # no rows: one zero tile
    padded = F.pad(rows, (0, 0, 0, padded_count - count))
    out = torch.cat([fn(padded[i:i + tile_rows]) for i in range(0, padded.shape[0], tile_rows)])
    return out[:count].reshape(*x.shape[:-1], out.shape[-1])


def _onednn_linear() -> object | None:
    """``torch.ops.mkldnn._linear_pointwise`` (the packed CPU linear) where torch has oneDNN."""
    return torch.ops.mkldnn._linear_pointwise if torch.backends.mkldnn.is_available() else None


class BatchInvariantMode(TorchFunctionMode):
    """Inside it, ``F.linear``, oneDNN's linear and ``F.rms_norm`` run through :func:`tiled_rows`;
    every other function runs unchanged. Thinking Machines' ``set_batch_invariant_mode`` and vLLM
    replace torch's kernels the same way, process-wide through ``torch.library``; here only while a
    forward pass of an engine that asked for it runs."""

    def __init__(self) -> None:
        super().__init__()
        self._tiled = {F.linear, F.rms_norm} | ({_onednn_linear()} - {None})

    def __torch_function__(self, func: Callable, types: tuple, args: tuple = (),
                           kwargs: dict | None = None) -> object:
        """Tile the calls of the functions named above by their first argument's rows."""
        kwargs = kwargs or {}
        if func in self._tiled and args and isinstance(args[0], torch.Tensor) and args[0].dim():
            rest = args[1:]
            return tiled_rows(lambda tile: func(tile, *rest, **kwargs), args[0])
        return func(*args, **kwargs)


def attend_rowwise(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   first_position: int) -> torch.Tensor:
    """Attention of ``n`` consecutive new tokens of one sequence, one token per call.

    ``q`` is ``[n, heads, head_dim]`` for positions ``first_position ..``; ``keys`` / ``values``
    are ``[kv_heads, L, head_dim]``, the sequence's history through the block table
    (``L >= first_position + n``). Token ``j`` attends to keys ``0 .. first_position + j`` in its
    own SDPA call, its query heads laid along the query axis of the KV head they share
    (``[1, kv_heads, heads / kv_heads, d]``, as a decode step does), so its result depends on its
    own context and nothing else. Returns ``[n, heads, head_dim]``."""
    count, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    if keys.shape[1] < first_position + count:
        raise ValueError(f"keys hold {keys.shape[1]} positions, the last query needs "
                         f"{first_position + count}")
    out = torch.empty_like(q)
    for j in range(count):
        visible = first_position + j + 1
        out[j] = F.scaled_dot_product_attention(
            q[j].reshape(1, kv_heads, heads // kv_heads, head_dim),
            keys[None, :, :visible], values[None, :, :visible]).reshape(heads, head_dim)
    return out


class RequestNumbers(NamedTuple):
    """What a caller gets back from one request, to compare between runs: the generated ids, the
    raw logprob of each (``params.logprobs``) and of each prompt token after the first
    (``params.prompt_logprobs``)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_logprobs: tuple[float, ...]


class _Engine(Protocol):
    """What :func:`run_together` uses of an :class:`~servelab.engine.LLMEngine`."""

    def has_unfinished(self) -> bool: ...
    def add_request(self, prompt: str | list[int], params: SamplingParams) -> str: ...
    def step(self) -> list: ...


def run_together(engine: _Engine, prompts: Sequence[str | list[int]],
                 params: SamplingParams) -> list[RequestNumbers]:
    """Submit every prompt at once to an idle ``engine`` and step it until all end; each request's
    numbers, in prompt order. One prompt: that request alone. Ask ``params`` for ``logprobs`` and
    ``prompt_logprobs`` (0 is enough) to get them; otherwise those fields stay empty."""
    if engine.has_unfinished():
        raise ValueError("engine must be idle: other requests would join the batch")
    ids = [engine.add_request(prompt, params) for prompt in prompts]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    logprobs: dict[str, list[float]] = {i: [] for i in ids}
    prompt: dict[str, tuple[float, ...]] = {i: () for i in ids}
    while engine.has_unfinished():
        for out in engine.step().outputs:
            tokens[out.request_id] += out.delta_token_ids
            logprobs[out.request_id] += [entry.logprob for entry in out.logprobs]
            if out.prompt_logprobs is not None:
                prompt[out.request_id] = tuple(entry.logprob for entry in out.prompt_logprobs)
    return [RequestNumbers(tuple(tokens[i]), tuple(logprobs[i]), prompt[i]) for i in ids]


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (a length difference counts at the
    shorter one's end); None if they are equal."""
    index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if index is None and len(a) != len(b):
        return min(len(a), len(b))
    return index
