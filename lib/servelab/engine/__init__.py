"""A small real decoding engine: paged KV cache, continuous batching, chunked prefill, prefix caching,
preemption (recompute or swap), a batched sampler, streaming and a per-iteration trace.

Module map (one concept each, in the order a request meets them):

* :mod:`~servelab.engine.config` -- :class:`EngineConfig`, every knob;
* :mod:`~servelab.engine.validation` -- every check ``add_request`` makes;
* :mod:`~servelab.engine.control` -- the API between steps (add, cancel, pause / resume, stats) and the
  stream and generate drivers;
* :mod:`~servelab.engine.request` -- the engine's request record; :mod:`~servelab.engine.sequence` -- one
  sample's record (tokens, KV progress, text, timestamps), output processing and the step's outputs;
* :mod:`servelab.queue_policy` (shared with the tick simulators) -- queue order and preemption victims
  (FCFS, priority, SJF, SJF with aging, per-tenant fair queuing);
* :mod:`~servelab.engine.scheduler` -- one tick: admission under the reservation rule, token budget,
  preemption;
* :mod:`~servelab.engine.model_runner` -- the paged KV pool, paged attention, one forward pass over a
  named ``ForwardInput``; :mod:`~servelab.engine.swap` -- host swap space; :mod:`~servelab.engine.gpu_memory`
  -- sizing the pool;
* :mod:`~servelab.engine.sampler` -- the batched torch sampler;
* :mod:`~servelab.engine.engine` -- :class:`LLMEngine`: ``step`` as schedule -> prepare inputs -> forward
  -> sample -> process outputs;
* :mod:`~servelab.engine.reference` -- the plain full-recompute loop the tests compare against;
* :mod:`~servelab.engine.trace` -- per-step records (when ``EngineConfig.trace_steps`` asks for them).

The benchmark, the GPU check and the admission study measure the engine from outside: :mod:`servelab.bench`.
"""

from servelab.engine.config import EngineConfig
from servelab.engine.engine import FINISH_REASONS, LLMEngine, RequestOutput, SampleOutput, Usage
from servelab.engine.reference import reference_generate
from servelab.engine.scheduler import ScheduledChunk, SchedulerOutput
from servelab.engine.trace import StepRecord

__all__ = ["EngineConfig", "FINISH_REASONS", "LLMEngine", "RequestOutput", "ScheduledChunk", "SampleOutput",
           "SchedulerOutput", "StepRecord", "Usage", "reference_generate"]
