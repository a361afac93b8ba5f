"""The words of the state machine: every state a request can be in, and every resource it can own.

A module of its own so that the state machine (:mod:`servelab.lifecycle.state_machine`), the
ledger that records each ending (:mod:`servelab.lifecycle.ledger`) and the engine share them
without importing each other. System boundary: names only; what each state means and allows is
the state machine's.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["RequestState", "Resource"]


class RequestState(Enum):
    """Every state a request can be in, from arrival at the server to its one terminal record.

    ``STATE_TABLE[state].summary`` says what each state means. ``RUNNABLE`` is an alias of
    ``PREFILL``: the scheduler's name for "picked by a tick and physically allocated".
    """

    ARRIVED = "arrived"
    VALIDATED = "validated"
    QUEUED = "queued"
    DEGRADED = "degraded"
    PREFILL = "prefill"
    RUNNABLE = "prefill"
    DECODE = "decode"
    BACKPRESSURED = "backpressured"
    PREEMPTED = "preempted"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    FAILED = "failed"


class Resource(Enum):
    """Things a request can own; ``StateInfo.holds`` lists them per state."""

    KV_RESERVATION = "KV reservation (bookkeeping blocks promised, not yet allocated)"
    KV_BLOCKS = "physical KV blocks on the accelerator (refcounted, maybe shared)"
    BATCH_SLOT = "a slot in the active batch (max_num_seqs)"
    HOST_SWAP = "host-memory swap space holding its KV"
    STREAM_BUFFER = "bounded buffer of generated-but-unsent text on the response stream"
