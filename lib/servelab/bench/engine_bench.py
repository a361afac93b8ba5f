"""Engine benchmark: side by side in one process, on the same weights.

``python -m servelab.bench [--quick] [--out PATH] [--model DIR] [--device {cpu,cuda}] [--dtype
{float32,bfloat16}]``; ``python -m servelab.bench --speculative [--threads N]``: speculative
decoding on the real SmolLM2-135M (:mod:`servelab.bench.spec_bench`, saved to
``data/engine_bench_cpu_speculative.json``).

Device and dtype follow :func:`servelab.device.pick_device` (CPU + float32 unless a GPU is present,
or ``SERVELAB_DEVICE`` / ``SERVELAB_DTYPE`` say otherwise); every system runs the same weights
there, and the result records what it really ran on.

``--model smollm2-135m`` instead measures the real SmolLM2-135M-Instruct (the weight-bound regime):
the engine against ``transformers`` ``generate`` and ``generate_batch`` at 1, 8 and 32 requests, its
decode step against this machine's roofline floor, a per-step profile, and fp32 against bf16 where
the CPU has native bf16 (:mod:`servelab.bench.real_model`, 2 threads by default, saved to
``data/engine_bench_cpu_smollm2.json``).

Sections (every figure is measured here, in this process, one after the other):

1. batch 1: the engine vs the no-KV-cache loop (``reference.py``) vs ``transformers`` ``generate``;
2. 32 requests with skewed output lengths: the engine (continuous batching) vs ``generate`` on one
   padded static batch (every row runs to the longest request's length) vs the no-KV-cache loop (one
   request after another, run once because it is slow);
3. continuous vs static batching inside the engine (same slots, same requests; static refills only
   when the whole batch has finished);
4. prefix cache on/off: TTFT of requests that share a long prompt prefix;
5. chunked prefill on/off: the largest inter-token gap of running streams while a long prompt
   arrives, against that long prompt's own TTFT;
6. the cost of one decode step (``LLMEngine.step``: forward pass, sampling, bookkeeping) with 1, 8
   and 32 sequences in the batch: how much a step gets cheaper when finished rows leave it, which
   bounds what continuous batching can gain over a padded static batch on this hardware.

Throughput counts requested output tokens per wall-clock second, prefill included. The prefix cache
is off except in its own section (repeats replay the same prompts and would hit it). Latencies are
seconds at the engine API (``servelab.metrics.latency`` definitions). Greedy decoding, EOS ignored,
so every system generates exactly the requested tokens; the batch-1 section also checks that all
three agree token for token. Timings are sensitive to other load on the machine: the systems run
``repeats`` rounds, interleaved; a ratio is the median of the rounds' ratios with its band and
verdict (:mod:`servelab.bench.timing`), an absolute figure the best round.
"""

from __future__ import annotations

import json
import os
import platform
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from servelab import prose
from servelab.bench.timing import compare_ratios, rotated_rounds
from servelab.device import DTYPES, describe_device, dtype_name, pick_device
from servelab.engine.config import EngineConfig
from servelab.engine.llm_engine import LLMEngine
from servelab.engine.reference import reference_generate
from servelab.model import load_checkpoint, load_tokenizer, save_checkpoint
from servelab.model.llama import LlamaForCausalLM
from servelab.sampling.params import SamplingParams

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DEFAULT_OUT = DATA_DIR / "engine_bench_cpu.json"
SMOLLM2_135M = "smollm2-135m"
"""``--model`` name of SmolLM2-135M's shape with random weights (seed 0): the weight-bound regime,
no download (:mod:`servelab.bench.decode_floor`)."""


def default_out(device: torch.device) -> Path:
    """Where a run on ``device`` saves by default: ``data/engine_bench_cpu.json`` or
    ``..._cuda.json``."""
    return DATA_DIR / f"engine_bench_{device.type}.json"


def engine_config(model: LlamaForCausalLM, **overrides) -> EngineConfig:
    """Engine settings on the model's own device and dtype, prefix cache off unless ``overrides``
    turn it
    on: repeated runs replay the same prompts, and with the cache on every repeat after the first
    would skip its prefill, an advantage the baselines do not get. Only the prefix-cache section
    turns it on."""
    weight = model.lm_head.weight
    return EngineConfig(**({"device": str(weight.device), "dtype": dtype_name(weight.dtype),
                            "enable_prefix_caching": False} | overrides))


def hardware(device: torch.device, dtype: torch.dtype) -> dict:
    """What this run ran on: device (and the GPU's name and CUDA version on one), dtype, CPU model,
    core count, torch version, thread count and the machine's load when the run began."""
    return {**describe_device(device), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "dtype": dtype_name(dtype), "python": platform.python_version(),
            # other work on the machine skews wall times
            "load_average_1m_at_start": os.getloadavg()[0]}


def compare(systems: dict[str, Callable[[], object]], repeats: int) -> dict[str, dict]:
    """Run each system ``repeats`` times, round-robin with the order rotating each round (so a burst
    of outside load hits all of them alike and no system always runs after the same one).

    Returns per system the seconds of every round, by wall clock (``wall_repeats``) and by CPU time
    of this process (``cpu_repeats``, ``time.process_time``: less sensitive to other processes on a
    shared machine), and the smallest of each (``wall_s``, ``cpu_s``).
    """
    names = list(systems)
    times = {name: {"wall_repeats": [], "cpu_repeats": []} for name in names}
    for name in rotated_rounds(names, repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        systems[name]()
        times[name]["wall_repeats"].append(time.perf_counter() - wall)
        times[name]["cpu_repeats"].append(time.process_time() - cpu)
    for record in times.values():
        record["wall_s"], record["cpu_s"] = min(record["wall_repeats"]), min(record["cpu_repeats"])
    return times


def ratio(times: dict[str, dict], slow: str, fast: str) -> dict:
    """How many times faster ``fast`` is than ``slow``, by wall clock and by CPU time.

    Paired round by round where both ran at least 3 rounds (:func:`compare` interleaves them): the
    median of the per-round ratios, with the wall-clock ratio's band and verdict
    (:func:`servelab.bench.timing.compare_ratios`). Otherwise (a system run once because it is
    slow) the ratio of the best times, with no band."""
    a, b = times[slow], times[fast]
    rounds = len(a["wall_repeats"])
    if rounds < 3 or rounds != len(b["wall_repeats"]):
        return {"wall": a["wall_s"] / b["wall_s"], "cpu": a["cpu_s"] / b["cpu_s"], "band": None,
                "verdict": None}
    wall = compare_ratios(a["wall_repeats"], b["wall_repeats"])
    return {"wall": wall.ratio, "cpu": compare_ratios(a["cpu_repeats"], b["cpu_repeats"]).ratio,
            "band": list(wall.band), "verdict": wall.verdict}


def greedy(max_tokens: int) -> SamplingParams:
    """Greedy decoding of exactly ``max_tokens`` tokens (EOS ignored), identical in every system."""
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def random_prompts(
    rng: random.Random, count: int, low: int, high: int, vocab: int
) -> list[list[int]]:
    """Token-id prompts of ``low..high`` tokens (ids from 1, so no end-of-text marker appears)."""
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(low, high))] for _ in range(count)]


def skewed_lengths(
    rng: random.Random, count: int, short: tuple[int, int], long: tuple[int, int]
) -> list[int]:
    """Output lengths (tokens): three quarters short, one quarter long -- the shape of chat
    traffic."""
    return [rng.randint(*long) if i % 4 == 0 else rng.randint(*short) for i in range(count)]


def to_transformers(model: LlamaForCausalLM):
    """The same weights as a ``transformers.LlamaForCausalLM``, on the model's device and dtype,
    eval. Loaded without ``transformers``' progress bar (in a notebook it would be a widget)."""
    import transformers
    from transformers.utils import logging as hf_logging

    weight = model.lm_head.weight
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with tempfile.TemporaryDirectory() as directory:
            save_checkpoint(model, directory)
            hf = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=weight.dtype)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    return hf.to(weight.device).eval()


@torch.inference_mode()
def hf_generate(hf, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """``generate`` on one left-padded static batch; returns each row's new tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=hf.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=hf.device)
    out = hf.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[:, width:].tolist()


def run_engine(engine: LLMEngine, prompts: list[list[int]], lengths: list[int]) -> list:
    """All requests added at once, run to completion; returns the final outputs in order."""
    return engine.generate(prompts, [greedy(n) for n in lengths])


def run_static(engine: LLMEngine, prompts: list[list[int]], lengths: list[int], batch: int) -> None:
    """Static batching: admit ``batch`` requests, wait for all of them to finish, then the next
    group."""
    for start in range(0, len(prompts), batch):
        run_engine(engine, prompts[start:start + batch], lengths[start:start + batch])


# ----------------------------------------------------------------------------------------- sections


def bench_batch1(model, tokenizer, hf, rng, new_tokens: int, repeats: int) -> dict:
    """One 32-token prompt, ``new_tokens`` greedy tokens: the three systems, and whether they
    agree."""
    prompt = random_prompts(rng, 1, 32, 32, model.config.vocab_size)[0]
    engine = LLMEngine(model, tokenizer, engine_config(model))
    engine_ids = list(run_engine(engine, [prompt], [new_tokens])[0].token_ids)
    ref_ids = reference_generate(model, prompt, new_tokens)
    hf_ids = hf_generate(hf, [prompt], new_tokens)[0]
    times = compare(
        {
            "engine": lambda: run_engine(engine, [prompt], [new_tokens]),
            "no_kv_cache": lambda: reference_generate(model, prompt, new_tokens),
            "transformers_generate": lambda: hf_generate(hf, [prompt], new_tokens),
        },
        repeats,
    )
    return {"prompt_tokens": len(prompt), "new_tokens": new_tokens, "seconds": times,
            "tokens_per_s": {k: new_tokens / v["wall_s"] for k, v in times.items()},
            "engine_vs_generate": ratio(times, "transformers_generate", "engine"),
            "engine_vs_no_cache": ratio(times, "no_kv_cache", "engine"),
            "outputs_agree": engine_ids == ref_ids == hf_ids}


def bench_skewed(
    model, tokenizer, hf, rng, count: int, short, long, repeats: int, no_cache: bool = True
) -> dict:
    """``count`` requests at once, output lengths drawn from ``short``/``long`` (token ranges); the
    no-KV-cache loop too unless ``no_cache`` is False (on a 135M model it would take many
    minutes)."""
    prompts = random_prompts(rng, count, 16, 48, model.config.vocab_size)
    lengths = skewed_lengths(rng, count, short, long)
    useful = sum(lengths)
    engine = LLMEngine(model, tokenizer, engine_config(model, max_num_seqs=count))
    times = compare(
        {
            "engine": lambda: run_engine(engine, prompts, lengths),
            "transformers_generate_static": lambda: hf_generate(hf, prompts, max(lengths)),
        },
        repeats,
    )
    result = {"requests": count, "output_tokens": useful, "longest": max(lengths), "seconds": times}
    # the no-cache loop serves the requests one after another; it is slow, so it runs once
    if no_cache:
        times.update(compare({"no_kv_cache": lambda: [reference_generate(model, p, n)
                                                      for p, n in zip(prompts, lengths)]}, 1))
        result["engine_vs_no_cache"] = ratio(times, "no_kv_cache", "engine")
    return result | {"tokens_per_s": {k: useful / v["wall_s"] for k, v in times.items()},
                     "engine_vs_generate": ratio(times, "transformers_generate_static", "engine")}


def bench_continuous_vs_static(
    model, tokenizer, rng, count: int, batch: int, short, long, repeats: int
) -> dict:
    """The same engine and ``batch`` slots, refilled every step (continuous) or per whole batch
    (static)."""
    prompts = random_prompts(rng, count, 16, 48, model.config.vocab_size)
    lengths = skewed_lengths(rng, count, short, long)
    rng.shuffle(lengths)
    engine = LLMEngine(model, tokenizer, engine_config(model, max_num_seqs=batch))
    times = compare({"continuous": lambda: run_engine(engine, prompts, lengths),
                     "static": lambda: run_static(engine, prompts, lengths, batch)}, repeats)
    return {
        "requests": count,
        "batch_slots": batch,
        "output_tokens": sum(lengths),
        "seconds": times,
        "tokens_per_s": {k: sum(lengths) / v["wall_s"] for k, v in times.items()},
        "continuous_vs_static": ratio(times, "static", "continuous"),
    }


def bench_prefix_cache(model, tokenizer, rng, count: int, prefix_len: int, repeats: int) -> dict:
    """Mean TTFT (seconds) of requests sharing a ``prefix_len``-token prefix, sent one after
    another."""
    vocab = model.config.vocab_size
    prefix = random_prompts(rng, 1, prefix_len, prefix_len, vocab)[0]
    prompts = [prefix + tail for tail in random_prompts(rng, count, 4, 12, vocab)]
    result = {"requests": count, "shared_prefix_tokens": prefix_len}
    for caching in (False, True):
        def mean_ttft() -> float:
            """A fresh engine (empty cache) serving the prompts in turn; TTFT averaged from the
            second."""
            engine = LLMEngine(
                model, tokenizer, engine_config(model, enable_prefix_caching=caching)
            )
            outs = [run_engine(engine, [p], [4])[0] for p in prompts]  # one after another
            # the first one fills the cache
            return sum(o.timing.ttft for o in outs[1:]) / (count - 1)

        result["ttft_s_cache_on" if caching else "ttft_s_cache_off"] = min(
            mean_ttft() for _ in range(repeats)
        )
    result["ttft_speedup"] = result["ttft_s_cache_off"] / result["ttft_s_cache_on"]
    return result


def bench_chunked_prefill(
    model, tokenizer, rng, streams: int, long_len: int, chunk: int, repeats: int
) -> dict:
    """``streams`` decoding requests, then a ``long_len``-token prompt: their worst gap vs its TTFT
    (seconds)."""
    vocab = model.config.vocab_size
    short = random_prompts(rng, streams, 8, 16, vocab)
    long_prompt = random_prompts(rng, 1, long_len, long_len, vocab)[0]
    result = {"running_streams": streams, "long_prompt_tokens": long_len, "chunk_tokens": chunk}
    for chunked in (False, True):
        config = engine_config(
            model,
            enable_chunked_prefill=chunked,
            max_num_batched_tokens=chunk if chunked else model.config.max_position_embeddings,
        )

        def measure() -> tuple[float, float]:
            """(max inter-token gap of the streams around the long prompt's wait, the long prompt's
            TTFT)."""
            engine = LLMEngine(model, tokenizer, config)
            ids = [engine.add_request(p, greedy(48)) for p in short]
            for _ in range(8):  # the streams are decoding before the long prompt arrives
                engine.step()
            long_id = engine.add_request(long_prompt, greedy(4))
            finals = {}
            while engine.has_unfinished():
                finals.update({o.request_id: o for o in engine.step().outputs if o.finished})
            first_emit = finals[long_id].timing.emit_times[0]
            arrival = finals[long_id].timing.arrival
            gaps = [
                b - a
                for i in ids
                for a, b in zip(finals[i].timing.emit_times, finals[i].timing.emit_times[1:])
                if b >= arrival and a <= first_emit
            ]  # gaps overlapping the long prompt's wait
            return max(gaps), first_emit - arrival

        runs = [measure() for _ in range(repeats)]
        key = "chunked" if chunked else "unchunked"
        result[f"max_itl_s_{key}"] = min(r[0] for r in runs)
        result[f"long_prompt_ttft_s_{key}"] = min(r[1] for r in runs)
    return result


def decoding_engine(model: LlamaForCausalLM, tokenizer, batch: int, context: int, steps: int,
                    rng: random.Random) -> LLMEngine:
    """An engine with ``batch`` random prompts of ``context`` tokens, every one prefilled (in as
    many steps as the token budget needs) and ready for at least ``steps`` pure decode steps."""
    blocks_per_seq = -(-(context + steps + 4) // 16)
    engine = LLMEngine(
        model,
        tokenizer,
        engine_config(
            model,
            max_num_seqs=batch,
            block_size=16,
            num_blocks=batch * blocks_per_seq + 1,
            max_num_batched_tokens=max(512, context),
            trace_steps=1,
        ),
    )
    for prompt in random_prompts(rng, batch, context, context, model.config.vocab_size):
        engine.add_request(prompt, greedy(steps + 4))
    engine.step()
    while engine.scheduler.waiting or engine.trace[-1].prefill_tokens:
        engine.step()
    return engine


def bench_step_cost(model, tokenizer, rng, batch_sizes: tuple[int, ...], context: int, steps: int,
                    repeats: int) -> dict:
    """CPU seconds of one decode step with ``batch`` sequences of about ``context`` tokens each: the
    best of ``repeats`` runs of ``steps`` pure decode steps (one new token per sequence) on a
    :func:`decoding_engine`."""
    step_s: dict[str, float] = {}
    for batch in batch_sizes:
        best = float("inf")
        for _ in range(repeats):
            engine = decoding_engine(model, tokenizer, batch, context, steps, rng)
            start = time.process_time()
            for _ in range(steps):
                engine.step()
            best = min(best, (time.process_time() - start) / steps)
        step_s[str(batch)] = best  # JSON keys are strings
    return {"context_tokens": context, "timed_steps": steps, "step_s": step_s}


# ------------------------------------------------------------------------------------------- driver


def run(
    quick: bool, model_dir: str | None, device: str | None = None, dtype: str | None = None
) -> dict:
    """Every section on the checkpoint in ``model_dir`` (default: the shipped model), on ``device``
    in ``dtype`` (defaults: :func:`servelab.device.pick_device`); a JSON-ready dict."""
    torch.set_num_threads(1)
    where, precision = pick_device(device, dtype)
    machine = hardware(where, precision)
    torch.manual_seed(0)
    rng = random.Random(0)
    model = load_checkpoint(model_dir, device=where, dtype=precision)
    tokenizer = load_tokenizer(model_dir)
    hf = to_transformers(model)
    # several round-robin runs: a ratio is the median of the rounds' ratios with its band, to see
    # past bursts of outside load on a shared machine (run to run, single runs here vary by 10-20 %)
    repeats = 1 if quick else 5
    batch1_repeats = 2 if quick else 7
    short, long = ((4, 12), (48, 64)) if quick else ((8, 32), (128, 192))
    max_len = model.config.max_position_embeddings
    sections = {}
    start = time.perf_counter()
    sections["batch1"] = bench_batch1(
        model, tokenizer, hf, rng, 32 if quick else 128, batch1_repeats
    )
    sections["skewed_32"] = bench_skewed(model, tokenizer, hf, rng, 32, short, long, repeats)
    sections["continuous_vs_static"] = bench_continuous_vs_static(
        model, tokenizer, rng, 32, 8, short, long, repeats
    )
    sections["prefix_cache"] = bench_prefix_cache(model, tokenizer, rng, 6 if quick else 12,
                                                  min(192, max_len // 2), repeats)
    sections["chunked_prefill"] = bench_chunked_prefill(
        model, tokenizer, rng, 4, min(384, max_len - 16), 32, repeats
    )
    sections["step_cost"] = bench_step_cost(
        model, tokenizer, rng, (1, 8, 32), min(128, max_len // 2), 8 if quick else 32, repeats
    )
    return {
        "hardware": machine,
        "model": {
            "directory": str(model_dir or "shipped"),
            "parameters": sum(p.numel() for p in model.parameters()),
            "config": model.config.to_hf_dict(),
        },
        "quick": quick,
        "repeats": repeats,
        "seconds_total": time.perf_counter() - start,
        "targets_met": targets_met(sections),
        **sections,
    }


def targets_met(sections: dict) -> dict[str, dict[str, bool]]:
    """The course's CPU targets, checked by wall-clock and by CPU-time ratio: parity with
    ``generate`` at batch 1, at least 2x its throughput on the skewed workload, continuous at least
    1.5x static."""
    checks = {
        "batch1_parity_with_generate": (sections["batch1"]["engine_vs_generate"], 1.0),
        "skewed_2x_generate": (sections["skewed_32"]["engine_vs_generate"], 2.0),
        "continuous_1.5x_static": (sections["continuous_vs_static"]["continuous_vs_static"], 1.5),
    }
    return {
        name: {kind: r[kind] >= goal for kind in ("wall", "cpu")}
        for name, (r, goal) in checks.items()
    }


def hardware_line(result: dict) -> str:
    """Where a :func:`run` result was measured: every absolute figure is only true on this
    machine."""
    hw = result["hardware"]
    gpu = f"{hw['gpu']} (CUDA {hw['cuda']}), " if hw.get("gpu") else ""
    return (
        f"{gpu}{hw['cpu']}, {hw['cores']} cores, torch {hw['torch']}, "
        f"{prose.count(hw['threads'], 'thread')}, "
        f"{hw['dtype']}, load average {hw['load_average_1m_at_start']:.1f} at start"
    )


def ratio_text(r: dict) -> str:
    """A :func:`ratio` by wall clock as the book prints it: "1.80× (band 1.72–2.08×)", or the bare
    ratio where it has no band."""
    band = f" (band {r['band'][0]:.2f}–{r['band'][1]:.2f}×)" if r.get("band") else ""
    return f"{r['wall']:.2f}×{band}"


def summary_rows(result: dict) -> list[tuple[str, str]]:
    """(measurement, figure) pairs of a :func:`run` result; ratios are "x times faster": the median
    of the rounds' ratios by wall clock, with its 95 % band, and by CPU time of this process (the
    no-KV-cache loop runs once: its ratio is of the best times)."""
    b1, sk, cs = result["batch1"], result["skewed_32"], result["continuous_vs_static"]
    pc, cp, sc = result["prefix_cache"], result["chunked_prefill"], result["step_cost"]

    def times(r: dict) -> str:
        """A speed-up ratio by wall clock (with its band where paired) and by CPU time."""
        return f"{ratio_text(r)} wall, {r['cpu']:.2f}× cpu"

    tps = "{:.0f} tok/s".format
    ms = "{:.1f} ms".format
    return [
        ("batch 1: engine", tps(b1["tokens_per_s"]["engine"])),
        ("batch 1: no KV cache (full recompute)", tps(b1["tokens_per_s"]["no_kv_cache"])),
        ("batch 1: transformers generate", tps(b1["tokens_per_s"]["transformers_generate"])),
        ("batch 1: engine vs generate", times(b1["engine_vs_generate"])),
        ("batch 1: engine vs no KV cache", times(b1["engine_vs_no_cache"])),
        ("batch 1: the three produce the same tokens", prose.yes_no(b1["outputs_agree"])),
        ("32 skewed requests: engine", tps(sk["tokens_per_s"]["engine"])),
        (
            "32 skewed requests: generate, one padded batch",
            tps(sk["tokens_per_s"]["transformers_generate_static"]),
        ),
        ("32 skewed requests: no KV cache, one at a time", tps(sk["tokens_per_s"]["no_kv_cache"])),
        ("32 skewed requests: engine vs generate", times(sk["engine_vs_generate"])),
        ("32 skewed requests: engine vs no KV cache", times(sk["engine_vs_no_cache"])),
        (f"{cs['batch_slots']} slots: continuous batching", tps(cs["tokens_per_s"]["continuous"])),
        (f"{cs['batch_slots']} slots: static batching", tps(cs["tokens_per_s"]["static"])),
        (f"{cs['batch_slots']} slots: continuous vs static", times(cs["continuous_vs_static"])),
        ("shared prefix: mean TTFT, prefix cache off", ms(pc["ttft_s_cache_off"] * 1e3)),
        ("shared prefix: mean TTFT, prefix cache on", ms(pc["ttft_s_cache_on"] * 1e3)),
        ("long prompt arrives: max ITL of streams, unchunked", ms(cp["max_itl_s_unchunked"] * 1e3)),
        ("long prompt arrives: max ITL of streams, chunked", ms(cp["max_itl_s_chunked"] * 1e3)),
        ("long prompt arrives: its TTFT, unchunked", ms(cp["long_prompt_ttft_s_unchunked"] * 1e3)),
        ("long prompt arrives: its TTFT, chunked", ms(cp["long_prompt_ttft_s_chunked"] * 1e3)),
        *(
            (
                f"one decode step, {prose.count(int(rows), 'sequence')} of "
                f"~{sc['context_tokens']} tokens",
                f"{t * 1e3:.2f} ms cpu",
            )
            for rows, t in sc["step_s"].items()
        ),
    ]


def load_saved(path: Path = DEFAULT_OUT) -> dict:
    """The result the last full benchmark run saved (the book shows it with its hardware)."""
    return json.loads(Path(path).read_text())


def format_table(result: dict) -> str:
    """Human-readable summary of a :func:`run` result."""
    lines = [
        f"hardware: {hardware_line(result)}",
        "ratios: x times faster, median of the rounds' ratios by wall clock (95 % band) and by CPU "
        "time of this process",
        "",
    ]
    lines += [f"{label:<54}{value:>18}" for label, value in summary_rows(result)]
    return "\n".join(lines)
