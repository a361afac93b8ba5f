"""Parallel sampling (``SamplingParams.n > 1``): the prompt is prefilled once, then forked into
``n`` samples.

Sample 0 is admitted alone, holding a batch slot for each sibling in advance
(``EngineSequence.batch_slots``). The step that computes its last prompt chunk forks it
(:func:`fork_finished_prompts`, which calls
``Scheduler.fork``: the scheduler owns the running queue the siblings join): every sibling shares
each block of its table (``BlockAllocator.fork``; a write into a shared, partly filled tail block is
copied on write), takes its progress, one batch slot, a running place and a share of its
reservation, and all ``n`` draw their first token from the same logits row. A request with ``n ==
1`` never gets here.
"""

from __future__ import annotations

from servelab.engine.scheduler import Scheduler
from servelab.engine.sequence import EngineSequence

__all__ = ["fork_finished_prompts"]


def fork_finished_prompts(
    scheduler: Scheduler, sampled: list[EngineSequence]
) -> list[tuple[EngineSequence, int]]:
    """Fork each sampled sequence that still has samples to fork into (its prompt was just
    computed).

    Returns the samples to draw a token for, each with its row of the step's logits
    (``sampled[row]`` produced it): a forked request's samples all read the row of its last prompt
    position.
    """
    picks: list[tuple[EngineSequence, int]] = []
    for row, seq in enumerate(sampled):
        if not seq.samples_to_fork:
            picks.append((seq, row))
            continue
        request = seq.request
        scheduler.fork(seq, request.seqs[1:])
        request.forked = True
        picks += [(s, row) for s in request.seqs]
    return picks
