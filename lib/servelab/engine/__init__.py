"""A small real decoding engine: paged KV cache, continuous batching, chunked prefill, prefix caching,
preemption (recompute or swap), a batched sampler, streaming and a per-iteration trace.

Module map (one concept each, in the order a request meets them):

* :mod:`~servelab.engine.config` -- :class:`EngineConfig`, every knob;
* :mod:`~servelab.engine.sequence` -- one request's tokens, KV progress and timestamps; incremental
  detokenisation;
* :mod:`~servelab.engine.policy` -- queue order and preemption victims (FCFS, priority, SJF);
* :mod:`~servelab.engine.scheduler` -- one tick: admission with KV reservation, token budget, preemption;
* :mod:`~servelab.engine.attention` -- the paged KV pool and the paged attention backend;
* :mod:`~servelab.engine.model_runner` -- one forward pass over a mixed batch; swap space;
* :mod:`~servelab.engine.sampler` -- the batched torch sampler;
* :mod:`~servelab.engine.engine` -- :class:`LLMEngine`, the API;
* :mod:`~servelab.engine.reference` -- the plain full-recompute loop the tests compare against;
* :mod:`~servelab.engine.trace` -- per-step records; :mod:`~servelab.engine.bench` -- the benchmark.
"""

from servelab.engine.config import EngineConfig
from servelab.engine.engine import FINISH_REASONS, LLMEngine, RequestOutput, SampleOutput, TokenUsage
from servelab.engine.reference import reference_generate
from servelab.engine.scheduler import ScheduledChunk, SchedulerOutput
from servelab.engine.trace import StepRecord

__all__ = ["EngineConfig", "FINISH_REASONS", "LLMEngine", "RequestOutput", "ScheduledChunk", "SampleOutput",
           "SchedulerOutput", "StepRecord", "TokenUsage", "reference_generate"]
