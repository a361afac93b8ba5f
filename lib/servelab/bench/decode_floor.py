"""The decode step against this machine's roofline floor, on SmolLM2-135M's shape (the weight-bound
regime).

:func:`bench_floor` takes this machine's roofline (:mod:`servelab.metrics.roofline`), then the
engine's decode step at a few batch sizes and ``transformers`` ``generate``'s per-token step at
batch 1, each set against ``max(bytes / bandwidth, FLOPs / peak, ops x overhead)``. "Fraction of
floor" is the floor over the measured step (1.0 = at the floor). :func:`smollm2_random` is a
random-weight model with SmolLM2-135M's exact configuration (the speed regime depends only on
shapes). ``python -m servelab.bench --model smollm2-135m`` runs these on the real weights
(:mod:`servelab.bench.real_model`).

:func:`decode_floor_rows` is the engine part on any model, for the chapters' notebooks.

System boundary: this process on the CPU, float32, ``threads`` torch threads; wall-clock medians
unless a ``clock`` is given (the notebooks pass :func:`time.thread_time` at one thread). Timings on
a shared machine are noisy: the JSON keeps the load average at the start beside them.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import torch

from servelab.bench.engine_bench import decoding_engine, hardware_line, random_prompts
from servelab.model.llama import LlamaConfig, LlamaForCausalLM
from servelab.model.pretrained import SMOLLM2_135M_CONFIG
from servelab.metrics.roofline import decode_cost
from servelab.metrics.roofline.measured import (
    Clock,
    Roofline,
    count_ops,
    decode_floor,
    measure_roofline,
    model_shape,
)

__all__ = [
    "bench_floor",
    "decode_floor_rows",
    "format_floor",
    "gemv_only",
    "gemv_only_s",
    "weight_read",
    "round_robin_medians",
    "smollm2_random",
]


def smollm2_random(seed: int = 0) -> LlamaForCausalLM:
    """A random-weight model with SmolLM2-135M's exact configuration (134.5 M parameters, 538 MB
    fp32)."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig.from_hf_dict(SMOLLM2_135M_CONFIG)).eval()


def round_robin_medians(steps: int, fns: dict[str, Callable[[], object]],
                        clock: Clock = time.perf_counter) -> dict[str, float]:
    """Median seconds on ``clock`` (default wall clock) of one call of each of ``fns``, over
    ``steps`` rounds of one call each: a burst of outside load on a shared machine hits every system
    alike, not only the one measured then."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(steps):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def gemv_only(model: LlamaForCausalLM) -> Callable[[], None]:
    """Every matrix of one batch-1 decode step and nothing else: ``x @ W.T`` for each linear layer's
    weight and the LM head, one after another. What torch's own GEMVs reach here bounds the engine
    from below more tightly than the bandwidth probe does."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    x = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights}

    @torch.inference_mode()
    def run() -> None:
        for w in weights:
            x[w.shape[1]] @ w.T

    return run


def weight_read(model: LlamaForCausalLM) -> Callable[[], None]:
    """A STREAM-like ``sum`` over every parameter once: the bytes a batch-1 decode step must read
    (the KV aside), at the speed a plain read gets. Timed round-robin beside the step, it is the
    weight-read floor measured side by side rather than minutes before."""
    params = list(model.parameters())

    @torch.inference_mode()
    def run() -> None:
        for p in params:
            p.sum()

    return run


def gemv_only_s(model: LlamaForCausalLM, steps: int, clock: Clock = time.perf_counter) -> float:
    """Median seconds on ``clock`` of :func:`gemv_only`'s matrices, over ``steps`` calls."""
    return round_robin_medians(steps, {"gemv": gemv_only(model)}, clock)["gemv"]


def hf_decode_step(hf, prompt: list[list[int]]) -> Callable[[], None]:
    """One ``transformers`` decode forward pass with its KV cache per call (batch 1, greedy token
    fed back), after the prompt's prefill: the per-token step ``generate`` repeats."""
    with torch.inference_mode():
        out = hf(torch.tensor(prompt, device=hf.device), use_cache=True)

    @torch.inference_mode()
    def step() -> None:
        nonlocal out
        out = hf(out.logits[:, -1:].argmax(-1), cache=out.cache, use_cache=True)

    return step


def floor_row(
    model: LlamaForCausalLM, roof: Roofline, batch: int, context: int, ops: int, step_s: float
) -> dict:
    """One measured decode step (``step_s`` seconds, ``batch`` sequences of ``context`` tokens,
    ``ops`` operators) against its floor on ``roof``: per-token share, its three floors (seconds),
    bound, fraction of floor, and where it sits on the roofline (arithmetic intensity in FLOP/byte,
    achieved FLOP/s and bytes/s)."""
    floor = decode_floor(model, roof, context, batch, ops)
    cost = decode_cost(model_shape(model), context, batch)
    return {
        "batch": batch,
        "context_tokens": context,
        "step_s": step_s,
        "per_token_s": step_s / batch,
        "ops": ops,
        "floor_s": {
            "memory": floor.memory_s,
            "compute": floor.compute_s,
            "overhead": floor.overhead_s,
        },
        "bound": floor.bound,
        "fraction_of_floor": floor.fraction_of(step_s),
        "intensity_flop_per_byte": cost.intensity,
        "achieved_flops": cost.flops / step_s,
        "achieved_bytes_per_s": cost.bytes / step_s,
    }


def decode_floor_rows(model: LlamaForCausalLM, tokenizer, roof: Roofline, rng: random.Random,
                      batch_sizes: tuple[int, ...], context: int, steps: int,
                      clock: Clock = time.perf_counter) -> list[dict]:
    """The engine's decode step at each batch size against its floor on ``roof``
    (:func:`floor_row`), the median of ``steps`` steps on ``clock`` (use the clock ``roof`` was
    measured on). Every sequence holds ``context`` prompt tokens (plus the two a timed step has
    already decoded)."""
    rows = []
    for batch in batch_sizes:
        engine = decoding_engine(model, tokenizer, batch, context, steps + 2, rng)
        ops = count_ops(engine.step)
        step_s = round_robin_medians(steps, {"engine": engine.step}, clock)["engine"]
        rows.append(floor_row(model, roof, batch, context + 2, ops, step_s))
    return rows


def bench_floor(
    model, tokenizer, hf, rng, batch_sizes: tuple[int, ...], context: int, steps: int
) -> dict:
    """The engine's decode step at each batch size against its roofline floor; at batch 1,
    round-robin with ``generate``'s per-token step (:func:`hf_decode_step`), the bare GEMVs
    (:func:`gemv_only`) and a plain read of the weights (:func:`weight_read`), so their ratios are
    measured side by side (``batch_sizes`` must include 1); ``context`` prompt tokens each."""
    roof = measure_roofline()
    rows, batch1 = [], {}
    for batch in batch_sizes:
        engine = decoding_engine(model, tokenizer, batch, context, steps + 2, rng)
        ops = count_ops(engine.step)
        fns = {"engine": engine.step}
        if batch == 1:
            fns |= {
                "transformers": hf_decode_step(
                    hf, random_prompts(rng, 1, context, context, model.config.vocab_size)
                ),
                "gemv_only": gemv_only(model),
                "weight_read": weight_read(model),
            }
        medians = round_robin_medians(steps, fns)
        if batch == 1:
            batch1 = medians
        rows.append(floor_row(model, roof, batch, context + 2, ops, medians["engine"]))
    hf_floor = decode_floor(model, roof, context, 1, 0)
    gemv_bytes = sum(m.weight.numel() * m.weight.element_size() for m in model.modules()
                     if isinstance(m, torch.nn.Linear))
    gemv_s, hf_step = batch1["gemv_only"], batch1["transformers"]
    return {
        "roofline": roof.to_dict(),
        "engine": rows,
        "gemv_only_batch1": {
            "step_s": gemv_s,
            "bytes": gemv_bytes,
            "bandwidth_bytes_per_s": gemv_bytes / gemv_s,
            "engine_step_over_gemv": rows[0]["step_s"] / gemv_s,
        },
        "transformers_batch1": {
            "step_s": hf_step,
            "fraction_of_floor": hf_floor.memory_s / hf_step,
        },
        "engine_vs_generate_batch1": hf_step / rows[0]["step_s"],
        # the floor read beside the step: a plain read of the same weights over the step
        "weight_read_batch1": {
            "step_s": batch1["weight_read"],
            "fraction_of_floor": batch1["weight_read"] / rows[0]["step_s"],
            "gemv_fraction_of_floor": batch1["weight_read"] / gemv_s,
        },
    }


def format_floor(result: dict) -> str:
    """Human-readable summary of a result holding a :func:`bench_floor` section under ``"floor"``
    (and optionally a :func:`~servelab.bench.engine_bench.bench_skewed` run under
    ``"skewed_32"``)."""
    floor, roof = result["floor"], result["floor"]["roofline"]
    lines = [
        f"hardware: {hardware_line(result)}",
        f"read bandwidth {roof['read_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, fp32 peak "
        f"{roof['peak_flops']['float32'] / 1e9:.0f} GFLOP/s, bf16 peak "
        f"{roof['peak_flops']['bfloat16'] / 1e9:.0f}"
        f" GFLOP/s, one op {roof['op_overhead_s'] * 1e6:.1f} us, ridge "
        f"{roof['ridge_point_flop_per_byte']['float32']:.1f} FLOP/byte (fp32)",
        "",
    ]
    for row in floor["engine"]:
        f = row["floor_s"]
        lines.append(
            f"engine decode step, batch {row['batch']:>2}: {row['step_s'] * 1e3:7.1f} ms; "
            f"floors memory "
            f"{f['memory'] * 1e3:.1f} / compute {f['compute'] * 1e3:.1f} / overhead "
            f"{f['overhead'] * 1e3:.1f}"
            f" ms ({row['ops']} ops): {row['bound']}-bound, {row['fraction_of_floor']:.0%} of floor"
        )
    gemv = floor["gemv_only_batch1"]
    lines.append(
        f"the step's matrices alone (torch GEMVs), batch 1: {gemv['step_s'] * 1e3:.1f} ms, "
        f"{gemv['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s; engine step "
        f"{gemv['engine_step_over_gemv']:.2f}x that"
    )
    read = floor["weight_read_batch1"]
    lines.append(
        f"a plain read of the weights beside it: {read['step_s'] * 1e3:.1f} ms; engine step at "
        f"{read['fraction_of_floor']:.0%} of that floor, the bare GEMVs at "
        f"{read['gemv_fraction_of_floor']:.0%}"
    )
    hf = floor["transformers_batch1"]
    lines.append(
        f"transformers generate, batch 1: {hf['step_s'] * 1e3:.1f} ms per token, "
        f"{hf['fraction_of_floor']:.0%} of the memory floor; engine "
        f"{floor['engine_vs_generate_batch1']:.2f}x"
    )
    sk = result.get("skewed_32")  # absent from a bare bench_floor section
    if sk:
        lines.append(
            f"32 skewed requests ({sk['output_tokens']} tokens): engine "
            f"{sk['tokens_per_s']['engine']:.0f} "
            f"tok/s, "
            f"generate on one padded batch "
            f"{sk['tokens_per_s']['transformers_generate_static']:.0f} tok/s; "
            f"engine {sk['engine_vs_generate']['wall']:.2f}x wall, "
            f"{sk['engine_vs_generate']['cpu']:.2f}x cpu"
        )
    return "\n".join(lines)
