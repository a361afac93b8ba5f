"""The engine's reading order: the files one default ``LLMEngine.step`` walks through, in the order
a reader meets them, with what to read in each.

The book's architecture page renders it as a table with each file's length
(``book/_ext/course_map.py``), and §8 counts the lines from it, so the walk cannot drift from the
code: a name listed here that no longer exists fails the build.
"""

from __future__ import annotations

__all__ = ["ENGINE_STEP"]

# One default engine step (EngineConfig(), SamplingParams()), file by file in the order a reader
# meets them: (module, what to read there, why). What a default step does not run lives off this
# walk: tracing (engine.trace), swapping (engine.swap), the up-front rule (engine.admission), the n
# > 1 fork (engine.parallel_sampling), logits processors, grammar masks, truncation filters,
# logprobs, and the queueing disciplines beyond FCFS (queue_disciplines).
ENGINE_STEP: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "servelab.engine.engine",
        ("EngineCore.step", "EngineCore._run"),
        "the step's five phases, in order",
    ),
    (
        "servelab.engine.scheduler",
        ("Scheduler.schedule",),
        "phase 1: decodes, prefill chunks, admissions, preemption by recompute",
    ),
    (
        "servelab.engine.admission",
        ("ReservationPolicy.admit",),
        "what admission reserves under the default on-demand rule: the uncached prompt's blocks",
    ),
    (
        "servelab.scheduling.queue_policy",
        ("fcfs", "rank_waiting"),
        "the order the waiting queue is served in (FCFS)",
    ),
    (
        "servelab.kv.block_pool",
        ("BlockPool.allocate_prompt", "BlockPool.append_tokens"),
        "block tables, reservations, prefix hits",
    ),
    (
        "servelab.engine.model_runner",
        ("ForwardInput.from_chunks", "ModelRunner.execute", "PagedAttention"),
        "phases 2 and 3: the chunks as one flat batch, the forward pass, K/V through block tables",
    ),
    (
        "servelab.engine.cpu_linear",
        ("PackedLinear.forward",),
        "phase 3's linear layers on a CPU: oneDNN on weights packed once, for any number "
        "of rows",
    ),
    ("servelab.engine.sampler", ("sample_tokens",), "phase 4: one token per sample, batched"),
    (
        "servelab.engine.sequence",
        ("EngineSequence", "accept_token", "request_output"),
        "phase 5 on the per-sample record: text, stop strings, finish reasons, outputs",
    ),
)
