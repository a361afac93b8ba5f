"""Where one decode step's time goes: weight GEMMs, attention, the rest of the model, sampling, the
engine.

For a batch of ``B`` decoding sequences (:func:`~servelab.bench.engine_bench.decoding_engine`), the
parts of ``LLMEngine.step`` are timed one by one on the very inputs the step uses, round-robin so a
burst of outside load hits every part alike
(:func:`~servelab.bench.decode_floor.round_robin_medians`):

* **step**: ``engine.step()`` whole;
* **forward**: ``runner.execute`` on the step's :class:`~servelab.engine.model_runner.ForwardInput`;
* **weight GEMMs**: every ``nn.Linear`` of the model (and the LM head) on ``B`` rows, nothing else;
* **attention**: the paged backend of every layer (K/V write, block-table gather, SDPA) on the
  step's metadata;
* **inputs**: building the flat batch and its attention metadata (Python lists to tensors);
* **sampling**: the sampler on the step's logits.

Two parts are what is left: **rest of model** = forward - GEMMs - attention - inputs (embedding,
norms, RoPE, SiLU, residual adds, and the Python that dispatches them) and **engine** = step -
forward - sampling (scheduler, block tables, output processing). The floors beside them come from
the machine's roofline (:mod:`servelab.metrics.roofline.measured`): the weight read (every weight
once at the measured bandwidth), and the GEMMs' FLOPs at the measured peak.

System boundary: this process, the CPU, wall-clock medians in seconds; nothing here is in the
engine's hot path (the parts are replayed beside it).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch

from servelab.bench.decode_floor import round_robin_medians
from servelab.bench.engine_bench import decoding_engine
from servelab.engine.llm_engine import LLMEngine
from servelab.engine.model_runner import ForwardInput, build_metadata
from servelab.engine.sampler import SamplingRow, sample_tokens
from servelab.model.llama import LlamaForCausalLM
from servelab.metrics.roofline.measured import Clock, Roofline, count_ops, decode_floor

__all__ = ["PARTS", "profile_rows", "profile_step"]

PARTS = ("weight_gemms", "attention", "rest_of_model", "inputs", "sampling", "engine")
"""The parts a step is split into, in the order the profile reports them."""


def _captured_batch(engine: LLMEngine) -> ForwardInput:
    """The :class:`ForwardInput` of the engine's next step (the step runs; its batch is kept)."""
    seen: list[ForwardInput] = []
    execute = engine.runner.execute

    def spy(batch: ForwardInput) -> torch.Tensor:
        seen.append(batch)
        return execute(batch)

    engine.runner.execute = spy
    try:
        engine.step()
    finally:
        del engine.runner.execute  # the instance attribute goes: the method is back
    return seen[-1]


def _gemms(model: LlamaForCausalLM, rows: int) -> Callable[[], None]:
    """Every linear layer of one step on ``rows`` rows, one after another (the LM head included)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weight = model.lm_head.weight
    inputs = {
        m: torch.randn(rows, m.in_features, dtype=weight.dtype, device=weight.device)
        for m in linears
    }

    @torch.inference_mode()
    def run() -> None:
        for module, x in inputs.items():
            module(x)

    return run


def _attention(engine: LLMEngine, batch: ForwardInput) -> Callable[[], None]:
    """The paged attention of every layer on ``batch``'s metadata, with random q/k/v of its
    shapes."""
    runner, cfg = engine.runner, engine.runner.model.config
    tokens = len(batch.token_ids)
    q = torch.randn(
        tokens, cfg.num_attention_heads, cfg.head_dim, dtype=runner.dtype, device=runner.device
    )
    kv = torch.randn(
        tokens, cfg.num_key_value_heads, cfg.head_dim, dtype=runner.dtype, device=runner.device
    )
    metadata = build_metadata(batch.spans, runner.block_size, runner.device, runner.dtype)

    @torch.inference_mode()
    def run() -> None:
        runner.backend.metadata = metadata
        try:
            for layer in range(cfg.num_hidden_layers):
                runner.backend(layer, q, kv, kv)
        finally:
            runner.backend.metadata = None

    return run


def _inputs(engine: LLMEngine, batch: ForwardInput) -> Callable[[], None]:
    """What the step does in Python before the first kernel: the metadata and the id/position
    tensors."""
    runner = engine.runner

    def run() -> None:
        build_metadata(batch.spans, runner.block_size, runner.device, runner.dtype)
        torch.tensor(batch.token_ids, device=runner.device)
        torch.tensor(batch.positions, device=runner.device)

    return run


def _sampling(engine: LLMEngine, batch: ForwardInput) -> Callable[[], None]:
    """The sampler on this step's logits, with the running sequences' own parameters."""
    logits = engine.runner.execute(batch)
    seqs = list(engine.scheduler.running)[:logits.shape[0]]
    rows = [SamplingRow(s.params, s.prompt_ids, s.output_ids, s.generator) for s in seqs]
    return lambda: sample_tokens(logits, rows)


def profile_step(
    engine: LLMEngine, roof: Roofline, steps: int, clock: Clock = time.perf_counter
) -> dict:
    """The parts (:data:`PARTS`) of a decode step of ``engine`` (every sequence decoding), median
    seconds over ``steps`` rounds, beside the step's floors on ``roof``. The engine must hold at
    least ``steps + 2`` decode steps of work."""
    batch = _captured_batch(engine)
    model, runner = engine.runner.model, engine.runner
    rows = len(batch.sample_indices)
    context = max(span.start for span in batch.spans) + 1
    ops = count_ops(engine.step)
    medians = round_robin_medians(
        steps,
        {
            "step": engine.step,
            "forward": lambda: runner.execute(batch),
            "weight_gemms": _gemms(model, rows),
            "attention": _attention(engine, batch),
            "inputs": _inputs(engine, batch),
            "sampling": _sampling(engine, batch),
        },
        clock,
    )
    parts = {name: medians[name] for name in ("weight_gemms", "attention", "inputs", "sampling")}
    parts["rest_of_model"] = (
        medians["forward"] - parts["weight_gemms"] - parts["attention"] - parts["inputs"]
    )
    parts["engine"] = medians["step"] - medians["forward"] - parts["sampling"]
    floor = decode_floor(model, roof, context, rows, ops)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    gemm_flops = 2 * rows * sum(m.weight.numel() for m in linears)
    dtype = str(model.lm_head.weight.dtype).removeprefix("torch.")
    return {
        "batch": rows,
        "context_tokens": context,
        "step_s": medians["step"],
        "forward_s": medians["forward"],
        "parts_s": {name: parts[name] for name in PARTS},
        "shares": {name: parts[name] / medians["step"] for name in PARTS},
        "floor_s": {
            "weight_read": floor.memory_s,
            "gemm_compute": gemm_flops / roof.peak_flops[dtype],
            "ops_overhead": floor.overhead_s,
        },
        "ops": ops,
        "fraction_of_weight_read_floor": floor.memory_s / medians["step"],
        "gemms_fraction_of_weight_read_floor": floor.memory_s / parts["weight_gemms"],
    }


def profile_rows(
    model: LlamaForCausalLM,
    tokenizer,
    roof: Roofline,
    batch_sizes: tuple[int, ...],
    context: int,
    steps: int,
    seed: int = 0,
    clock: Clock = time.perf_counter,
) -> list[dict]:
    """:func:`profile_step` at each batch size, every sequence holding ``context`` prompt tokens."""
    rng = random.Random(seed)
    return [
        profile_step(
            decoding_engine(model, tokenizer, batch, context, 2 * steps + 8, rng),
            roof,
            steps,
            clock,
        )
        for batch in batch_sizes
    ]


def format_profile(rows: list[dict]) -> str:
    """A table: one line per batch size, milliseconds per part and the floors."""
    head = (
        f"{'batch':>5} {'step ms':>8} "
        + " ".join(f"{p:>13}" for p in PARTS)
        + "  weight-read floor"
    )
    lines = [head]
    for r in rows:
        parts = " ".join(f"{r['parts_s'][p] * 1e3:7.2f} ({r['shares'][p]:3.0%})" for p in PARTS)
        lines.append(
            f"{r['batch']:>5} {r['step_s'] * 1e3:8.2f} {parts}  "
            f"{r['floor_s']['weight_read'] * 1e3:.2f} ms "
            f"({r['fraction_of_weight_read_floor']:.0%} of the step)"
        )
    return "\n".join(lines)
