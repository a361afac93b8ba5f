"""The admission rules measured on one workload: what reserving the output up front costs and
buys, and what vLLM V1's per-step allocation does beside the course's two reservations.

:func:`compare_reservation_policies` runs the same requests (all queued at once, greedy, EOS
ignored, so every request generates exactly its ``max_tokens``) through a fresh ``LLMEngine`` per
policy of ``servelab.engine.admission.ReservationPolicy`` and reports, per policy:

* ``peak_running`` / ``mean_running``: sequences in the batch after each step (admitted
  concurrency);
* ``preemptions``: sequences preempted (recompute or swap-out) over the run;
* ``recomputed_tokens``: tokens whose KV a preempted sequence computed again after readmission, and
  ``preempted_hits`` / ``preempted_hit_rate``: tokens of the readmissions found in the prefix cache
  (vLLM's ``preempted_hits``) and their share of the tokens looked up
  (:class:`~servelab.engine.scheduler.PreemptionStats`);
* ``steps`` and ``tokens_per_step``: engine steps to finish, generated tokens per step
  (deterministic);
* ``throughput_tok_s``: generated tokens per wall-clock second (this machine, not deterministic);
* ``ttft_p99_steps`` / ``ttft_p99_s`` and ``ttft_mean_steps`` / ``ttft_mean_s``: the
  99th-percentile and the mean time to first token, in engine steps run up to and including the one
  that emitted it (deterministic) and in wall-clock seconds;
* ``kv_used_mean`` / ``kv_used_peak``: fraction of the pool's blocks holding KV after each step, and
  ``kv_reserved_mean``: fraction promised by reservations but not yet written (what up-front holds
      idle).

Deterministic figures are rounded (``digits``) so a notebook can check them; timings are left as
measured; :func:`time_reservation_policies` repeats the runs interleaved for timing ratios with a
noise band (:mod:`servelab.bench.timing`). System boundary: the engine API; the engine's clock
counts steps, wall time is read around it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import replace

from servelab._validate import require_int
from servelab.engine.config import EngineConfig
from servelab.engine.llm_engine import LLMEngine
from servelab.engine.config import RESERVATION_POLICIES
from servelab.bench.timing import Comparison, compare_ratios, time_interleaved
from servelab.metrics.latency import percentile
from servelab.model.llama import LlamaForCausalLM
from servelab.sampling.params import SamplingParams


def compare_reservation_policies(
    model: LlamaForCausalLM,
    tokenizer,
    prompts: Sequence[str | list[int]],
    max_tokens: Sequence[int],
    config: EngineConfig,
    policies: Sequence[str] = RESERVATION_POLICIES,
    digits: int = 3,
) -> dict[str, dict]:
    """Policy name -> the figures listed in the module docstring, for ``prompts[i]`` generating
    ``max_tokens[i]`` tokens, under ``config`` with only ``reservation_policy`` changed."""
    if len(prompts) != len(max_tokens) or not prompts:
        raise ValueError(f"prompts and max_tokens must be non-empty and of equal length, "
                         f"got {len(prompts)} and {len(max_tokens)}")
    for i, n in enumerate(max_tokens):
        require_int(f"max_tokens[{i}]", n, 1)
    require_int("digits", digits, 0)
    # every step's trace record is read, however many steps the run takes
    configs = {
        policy: replace(config, reservation_policy=policy, trace_steps=sys.maxsize)
        for policy in policies
    }
    return {
        policy: run_policy(model, tokenizer, prompts, max_tokens, configs[policy], digits)
        for policy in policies
    }


def run_policy(
    model: LlamaForCausalLM,
    tokenizer,
    prompts: Sequence[str | list[int]],
    max_tokens: Sequence[int],
    config: EngineConfig,
    digits: int = 3,
) -> dict:
    """One policy's run (``config.reservation_policy``); see
    :func:`compare_reservation_policies`."""
    step = [0]
    engine = LLMEngine(model, tokenizer, config, clock=lambda: float(step[0]))
    for prompt, n in zip(prompts, max_tokens):
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    walls, reserved, finals = [], [], []
    start = time.perf_counter()
    while engine.has_unfinished():
        finals += [o for o in engine.step().outputs if o.finished]
        walls.append(time.perf_counter() - start)
        reserved.append(engine.allocator.num_reserved_blocks)
        step[0] += 1
    return summarise(engine, finals, walls, reserved, digits)


def summarise(
    engine: LLMEngine, finals: list, walls: list[float], reserved: list[int], digits: int
) -> dict:
    """The figures of one finished run from its trace, final outputs, per-step wall times and
    reservations."""
    trace, pool = engine.trace, engine.allocator.num_blocks
    generated = sum(o.usage.generated_tokens for o in finals)
    preemption = engine.stats().preemption
    # steps run until it, inclusive
    first_steps = [o.timing.emit_times[0] - o.timing.arrival + 1 for o in finals]
    first_walls = [walls[int(o.timing.emit_times[0])] for o in finals]
    return {
        "requests": len(finals),
        "peak_running": max(r.num_running for r in trace),
        "mean_running": round(sum(r.num_running for r in trace) / len(trace), digits),
        "preemptions": sum(len(r.preempted) + len(r.swapped_out) for r in trace),
        "recomputed_tokens": preemption.recomputed_tokens,
        "preempted_hits": preemption.preempted_hits,
        "preempted_hit_rate": round(preemption.hit_rate, digits),
        "steps": len(walls),
        "tokens_per_step": round(generated / len(walls), digits),
        "throughput_tok_s": generated / walls[-1],
        "ttft_p99_steps": round(percentile(first_steps, 99).value, digits),
        "ttft_p99_s": percentile(first_walls, 99).value,
        "ttft_mean_steps": round(sum(first_steps) / len(first_steps), digits),
        "ttft_mean_s": sum(first_walls) / len(first_walls),
        "kv_used_mean": round(sum(r.blocks_used for r in trace) / (len(trace) * pool), digits),
        "kv_used_peak": round(max(r.blocks_used for r in trace) / pool, digits),
        "kv_reserved_mean": round(sum(reserved) / (len(reserved) * pool), digits),
    }


def time_reservation_policies(model: LlamaForCausalLM, tokenizer,
                              prompts: Sequence[str | list[int]], max_tokens: Sequence[int],
                              config: EngineConfig, baseline: str = "on-demand",
                              policies: Sequence[str] = RESERVATION_POLICIES, repeats: int = 5,
                              warmup: int = 1) -> dict[str, dict[str, Comparison]]:
    """Each policy's whole run against ``baseline``'s, timed interleaved (``repeats`` rounds, the
    order rotated per round, after ``warmup`` untimed runs each): policy ->
    ``{"wall": ..., "ttft_mean": ...}``, comparisons of ``t_baseline / t_policy`` in seconds (above
    1: the policy took less time; the same tokens, so the wall ratio is also the throughput ratio).
    The baseline itself is left out."""
    if baseline not in policies:
        raise ValueError(f"baseline must be one of policies {tuple(policies)}, got {baseline!r}")
    ttft: dict[str, list[float]] = {policy: [] for policy in policies}

    def run(policy: str):
        cfg = replace(config, reservation_policy=policy, trace_steps=sys.maxsize)
        return lambda: ttft[policy].append(
            run_policy(model, tokenizer, prompts, max_tokens, cfg)["ttft_mean_s"])

    walls = time_interleaved({policy: run(policy) for policy in policies}, repeats, warmup)
    ttft = {policy: values[warmup:] for policy, values in ttft.items()}
    return {policy: {"wall": compare_ratios(walls[baseline], walls[policy]),
                     "ttft_mean": compare_ratios(ttft[baseline], ttft[policy])}
            for policy in policies if policy != baseline}
