"""Parallel sampling (``SamplingParams.n > 1``): the prompt is prefilled once, then forked into ``n`` samples.

Sample 0 is admitted alone, holding a batch slot for each sibling in advance (``Sequence.batch_slots``).
The step that computes its last prompt chunk forks it (:func:`fork_finished_prompts`): every sibling
shares each block of its table (``BlockAllocator.fork``; a write into a shared, partly filled tail block
is copied on write), takes its progress, one batch slot, a running place and a share of its reservation,
and all ``n`` draw their first token from the same logits row. A request with ``n == 1`` never gets here.
"""

from __future__ import annotations

from servelab.engine.scheduler import Scheduler
from servelab.engine.sequence import Sequence, SeqStatus

__all__ = ["fork_finished_prompts", "fork"]


def fork_finished_prompts(scheduler: Scheduler, sampled: list[Sequence]) -> list[tuple[Sequence, int]]:
    """Fork each sampled sequence that still has samples to fork into (its prompt was just computed).

    Returns the samples to draw a token for, each with its row of the step's logits (``sampled[row]``
    produced it): a forked request's samples all read the row of its last prompt position.
    """
    picks: list[tuple[Sequence, int]] = []
    for row, seq in enumerate(sampled):
        if not seq.samples_to_fork:
            picks.append((seq, row))
            continue
        request = seq.request
        fork(scheduler, seq, request.seqs[1:])
        request.forked = True
        picks += [(s, row) for s in request.seqs]
    return picks


def fork(scheduler: Scheduler, parent: Sequence, children: list[Sequence]) -> None:
    """Split ``parent``, whose prompt is computed, into itself plus ``children``."""
    scheduler.slots.release(parent.seq_id)  # the parent held 1 + len(children) slots since admission
    for seq in (parent, *children):
        scheduler.slots.acquire(seq.seq_id)
    for child in children:
        scheduler.allocator.fork(parent.seq_id, child.seq_id)
        child.num_computed = parent.num_computed
        child.cached_prompt_tokens = parent.cached_prompt_tokens
        child.paused = parent.paused
        child.times.first_scheduled = parent.times.first_scheduled
        child.status = SeqStatus.RUNNING
        scheduler.running.append(child)
    _split_reservation(scheduler, parent, children)
    parent.samples_to_fork = 0


def _split_reservation(scheduler: Scheduler, parent: Sequence, children: list[Sequence]) -> None:
    """The parent's promise (made for all ``n`` samples) is shared out evenly."""
    allocator = scheduler.allocator
    total = allocator.release_reservation(parent.seq_id)
    share = total // (1 + len(children))
    for child in children:
        allocator.reserve(child.seq_id, share)
    allocator.reserve(parent.seq_id, total - share * len(children))
