"""A new request built, and its state read: the engine's ``EngineRequest`` and its ``n`` sequences.

One record per sample: a :class:`~servelab.engine.sequence.EngineSequence` holds that sample's
tokens, KV progress, text and timestamps, and points back to its
:class:`~servelab.engine.sequence.EngineRequest`, which only groups the samples (one unless
``params.n > 1``); the two records refer to each other, so they are defined together in
:mod:`servelab.engine.sequence`. The allocator keeps each sequence's block ids, nothing more.

The request's lifecycle state (``servelab.lifecycle.state_machine.RequestState``, §0's model) is not
stored: it is read off the scheduler's state of its sequences by :func:`lifecycle_state`, so the two
cannot drift.

System boundary: plain records; building one allocates nothing (the scheduler admits it later).
"""

from __future__ import annotations

import torch

from servelab.engine.sequence import (
    EngineRequest,
    IncrementalDetokenizer,
    EngineSequence,
    SequenceTimes,
    SeqStatus,
)
from servelab.lifecycle.state_machine import RequestState
from servelab.sampling.params import SamplingParams
from servelab.sampling.stop_strings import StopStringBuffer

FINISH_REASONS = ("stop", "length", "eos", "cancelled", "timed_out", "failed")
TERMINAL_STATE = {
    "stop": RequestState.FINISHED,
    "length": RequestState.FINISHED,
    "eos": RequestState.FINISHED,
    "cancelled": RequestState.CANCELLED,
    "timed_out": RequestState.TIMED_OUT,
    "failed": RequestState.FAILED,
}


def new_request(
    request_id: str,
    seq_ids: list[str],
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    tokenizer,
    arrival: float,
    arrival_index: int,
    seed: int,
    deadline: float | None,
    namespace: str,
    priority: int,
    tenant: str = "",
) -> EngineRequest:
    """A validated request, not yet admitted: one sequence per id in ``seq_ids``, sample ``i``
    seeded with ``seed + i``; sample 0 will fork into the others once its prompt is computed."""
    request = EngineRequest(request_id)
    for i, seq_id in enumerate(seq_ids):
        request.seqs.append(
            EngineSequence(
                seq_id,
                request,
                i,
                prompt_ids,
                params,
                arrival_index,
                SequenceTimes(arrival),
                torch.Generator().manual_seed(seed + i),
                IncrementalDetokenizer(tokenizer),
                StopStringBuffer(list(params.stop)),
                namespace=namespace,
                priority=priority,
                tenant=tenant,
                deadline=deadline,
            )
        )
    request.seq.samples_to_fork = len(seq_ids) - 1
    return request


def lifecycle_state(request: EngineRequest) -> RequestState:
    """The request's §0 lifecycle state, read off its sequences (a live request: not yet ended).

    VALIDATED: in the waiting queue, not yet admitted (it holds nothing: the engine's admission
    reserves and allocates in one tick, so it passes QUEUED, "reservation held", inside that tick
    and is next seen in PREFILL). PREEMPTED: back in the waiting queue after a preemption by
    recompute. SWAPPED: its KV is in host memory. PREFILL: running, the prompt (or a recompute)
    still to finish. DECODE: running, one token per step; BACKPRESSURED when the caller paused it
    there. After the fork the request is in DECODE (or BACKPRESSURED) while any sample runs: one
    sample's preemption shows in the trace, not in the request's state.
    """
    seq = request.seq
    if request.forked:
        return RequestState.BACKPRESSURED if seq.paused else RequestState.DECODE
    if seq.status is SeqStatus.WAITING:
        return (
            RequestState.VALIDATED if seq.times.first_scheduled is None else RequestState.PREEMPTED
        )
    if seq.status is SeqStatus.SWAPPED:
        return RequestState.SWAPPED
    if not seq.output_ids or seq.num_computed < seq.num_tokens - 1:
        return RequestState.PREFILL
    return RequestState.BACKPRESSURED if seq.paused else RequestState.DECODE
