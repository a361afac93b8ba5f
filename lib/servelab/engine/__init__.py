"""A small real decoding engine: paged KV cache, continuous batching, chunked prefill, prefix
caching, preemption (recompute or swap), a batched sampler, streaming and an optional per-iteration
trace.

One concept per module; the module map and the reading order of one ``LLMEngine.step`` are on the
book's architecture page (``book/architecture.md``, the order generated from
:data:`servelab.engine.reading_order.ENGINE_STEP`). The benchmark, the GPU check and the admission
study measure the engine from outside: :mod:`servelab.bench`.
"""

from servelab.engine.config import EngineConfig
from servelab.engine.engine import FINISH_REASONS, RequestOutput, SampleOutput, Usage
from servelab.engine.llm_engine import LLMEngine
from servelab.engine.reference import reference_generate
from servelab.engine.scheduler import ScheduledChunk, SchedulerOutput
from servelab.engine.trace import StepRecord

__all__ = [
    "EngineConfig",
    "FINISH_REASONS",
    "LLMEngine",
    "RequestOutput",
    "ScheduledChunk",
    "SampleOutput",
    "SchedulerOutput",
    "StepRecord",
    "Usage",
    "reference_generate",
]
