"""The engine's record of one request: its lifecycle and its samples, and how a new one is built.

One record per layer, each named for what it holds:

* :class:`EngineRequest` (here, engine layer): the request as a whole, its ``RequestLifecycle`` state
  machine (``servelab.lifecycle``) and its ``n`` sample streams;
* :class:`~servelab.engine.outputs.SampleStream` (output processing): one sample's text, held-back
  tail and emitted ids;
* :class:`~servelab.engine.sequence.Sequence` (scheduler and model runner): one sample's tokens, KV
  progress and timestamps;
* the allocator's private ``_BlockTable`` (``servelab.kv_allocator``): one sequence's block table.

System boundary: plain records; building one allocates nothing (the scheduler admits it later).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from servelab.engine.outputs import SampleStream
from servelab.engine.sequence import IncrementalDetokenizer, Sequence, SequenceTimes
from servelab.lifecycle import RequestLifecycle, RequestState
from servelab.sampling import SamplingParams
from servelab.streaming import StopStringBuffer

FINISH_REASONS = ("stop", "length", "eos", "cancelled", "timed_out", "failed")
TERMINAL_STATE = {"stop": RequestState.FINISHED, "length": RequestState.FINISHED, "eos": RequestState.FINISHED,
                  "cancelled": RequestState.CANCELLED, "timed_out": RequestState.TIMED_OUT,
                  "failed": RequestState.FAILED}


@dataclass(eq=False)
class EngineRequest:
    """Engine-side state of one request: its lifecycle and its samples (one unless ``params.n > 1``).

    Before the fork only sample 0's sequence is scheduled; it holds a batch slot for every sibling.
    """

    request_id: str
    lifecycle: RequestLifecycle
    samples: list[SampleStream]
    forked: bool = False
    finish_reason: str | None = None

    @property
    def seq(self) -> Sequence:
        """Sample 0's sequence: the one scheduled before the fork, the only one when n == 1."""
        return self.samples[0].seq


def new_request(request_id: str, sample_ids: list[str], prompt_ids: list[int], params: SamplingParams, *,
                tokenizer, arrival: float, arrival_index: int, seed: int, deadline: float | None,
                namespace: str, priority: int) -> EngineRequest:
    """A validated request as QUEUED: one sequence and sample stream per id in ``sample_ids``, sample ``i``
    seeded with ``seed + i``; sample 0 will fork into the others once its prompt is computed."""
    samples = []
    for i, seq_id in enumerate(sample_ids):
        seq = Sequence(seq_id, prompt_ids, params, arrival_index, SequenceTimes(arrival),
                       torch.Generator().manual_seed(seed + i), namespace=namespace, priority=priority,
                       deadline=deadline)
        samples.append(SampleStream(i, request_id, seq, IncrementalDetokenizer(tokenizer),
                                    StopStringBuffer(list(params.stop))))
    samples[0].seq.samples_to_fork = len(sample_ids) - 1
    lifecycle = RequestLifecycle(request_id, at=arrival)
    lifecycle.transition(RequestState.VALIDATED, arrival)
    lifecycle.transition(RequestState.QUEUED, arrival)
    return EngineRequest(request_id, lifecycle, samples)
