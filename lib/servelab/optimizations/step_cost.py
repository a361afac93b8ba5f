"""Decode step cost against batch size: where the fixed per-step cost stops dominating.

A decode step pays a cost that does not depend on how many sequences are in the batch (on an
accelerator: reading every weight once; on a CPU running a tiny model: per-operation overhead and
the Python around it) plus a cost per sequence (its matrix rows, its attention over its own history,
its sampling and bookkeeping). While the fixed part dominates, adding sequences is nearly free and
the step time is flat; past the batch size where the per-sequence part equals it, the step time
grows linearly and each extra sequence costs its full share. That batch size is where the bottleneck
migrates, and :func:`fit_step_cost` reads it off a measured curve with the model ``step(B) = fixed +
per_sequence * B``.

System boundary: :func:`measure_decode_step` times ``LLMEngine.step`` (forward pass, sampling,
bookkeeping) on one engine with every sequence decoding, in CPU seconds of the calling thread
(``time.thread_time``: other processes on a shared machine do not inflate it; torch must run on this
thread, ``torch.set_num_threads(1)``). The fit is least squares in relative error, no units of its
own, with one constraint: the fixed part is what a step costs with no sequence at all, so it can be
no larger than the smallest step measured. Where plain least squares puts it higher (the large
batches' points pull the line's intercept up), the line is pinned through that smallest point
instead.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from servelab._validate import require_int
from servelab.engine import EngineConfig, LLMEngine
from servelab.model.llama import LlamaForCausalLM
from servelab.sampling import SamplingParams

__all__ = ["StepCostFit", "fit_step_cost", "measure_decode_step"]


def measure_decode_step(model: LlamaForCausalLM, tokenizer, batch_size: int, context_tokens: int,
                        steps: int = 6, seed: int = 0) -> float:
    """Best CPU seconds of one ``LLMEngine.step`` with ``batch_size`` sequences all decoding.

    A fresh engine around ``model`` gives every sequence a random ``context_tokens``-token prompt,
    prefilled in one step before timing; then ``steps`` decode steps are timed and the fastest kept.
    """
    require_int("batch_size", batch_size, minimum=1)
    require_int("context_tokens", context_tokens, minimum=1)
    require_int("steps", steps, minimum=1)
    blocks_per_seq = -(-(context_tokens + steps + 1) // 16)
    config = EngineConfig(
        block_size=16,
        num_blocks=batch_size * blocks_per_seq + 1,
        max_num_seqs=batch_size,
        max_num_batched_tokens=max(512, batch_size * context_tokens),
        # the last step's record checks the batch
        enable_prefix_caching=False,
        trace_steps=1,
    )
    engine = LLMEngine(model, tokenizer, config)
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    for _ in range(batch_size):
        engine.add_request([rng.randrange(1, vocab) for _ in range(context_tokens)], params)
    engine.step()  # prefill every prompt (and sample each one's first token)
    best = float("inf")
    for _ in range(steps):
        start = time.thread_time()
        engine.step()
        best = min(best, time.thread_time() - start)
        if len(engine.trace[-1].decode_tokens) != batch_size:
            raise RuntimeError(
                f"a timed step decoded {len(engine.trace[-1].decode_tokens)} sequences, "
                f"not batch_size = {batch_size}"
            )
    return best


@dataclass(frozen=True)
class StepCostFit:
    """``step(B) = fixed + per_sequence * B`` (same unit as the fitted times)."""

    fixed: float
    per_sequence: float

    @property
    def knee_batch(self) -> float:
        """The batch size where the per-sequence cost equals the fixed cost: below it the step time
        is nearly flat, above it it grows linearly."""
        return self.fixed / self.per_sequence


def _line(batch_sizes: Sequence[int], step_times: Sequence[float],
          anchor: tuple[float, float] | None = None) -> tuple[float, float]:
    """(fixed, slope) of the line through the points by least squares in relative error (weights
    ``1 / t**2``: each point's percentage miss counts alike, so the many-sequence points do not
    outweigh the few-sequence ones); forced through ``anchor`` (batch size, step time) when
    given."""
    weights = [1.0 / t ** 2 for t in step_times]
    if anchor is None:
        total = sum(weights)
        anchor = (sum(w * b for w, b in zip(weights, batch_sizes)) / total,
                  sum(w * t for w, t in zip(weights, step_times)) / total)
    b0, t0 = anchor
    slope = (sum(w * (b - b0) * (t - t0) for w, b, t in zip(weights, batch_sizes, step_times))
             / sum(w * (b - b0) ** 2 for w, b in zip(weights, batch_sizes)))
    return t0 - slope * b0, slope


def fit_step_cost(batch_sizes: Sequence[int], step_times: Sequence[float]) -> StepCostFit:
    """The line ``step(B) = fixed + per_sequence * B`` through measured ``(batch size, step time)``
    points (at least two sizes, positive times), with its fixed part no larger than the smallest
    measured step (see the module docstring)."""
    if len(batch_sizes) != len(step_times) or len(set(batch_sizes)) < 2:
        raise ValueError(
            "batch_sizes and step_times must have the same length, with >= 2 distinct batch sizes"
        )
    if min(step_times) <= 0:
        raise ValueError("step_times must all be > 0")
    fixed, slope = _line(batch_sizes, step_times)
    smallest_time, its_batch = min(zip(step_times, batch_sizes))
    if fixed > smallest_time:  # pin the line through the smallest measured step
        fixed, slope = _line(batch_sizes, step_times, anchor=(its_batch, smallest_time))
    if slope <= 0 or fixed <= 0:
        raise ValueError(
            f"the fit has fixed = {fixed:.3g}, per_sequence = {slope:.3g}: both must be > 0 "
            "(measure over a wider range of batch sizes)"
        )
    return StepCostFit(fixed, slope)
