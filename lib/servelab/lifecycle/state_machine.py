"""The request state machine: states, guarded transitions, and one idempotent reclaim routine.

A serving request is not one forward pass. It passes an ingress gate, is tokenized, is admitted with
a KV *reservation*, waits, is picked by a scheduler tick (reservation becomes physical blocks), runs
prefill, samples its first token from the last prefill pass, decodes token by token, and ends. Side
branches (preemption, swapping, backpressure, cancellation, timeout, failure) can interrupt the
running stages. Each state says what must hold to enter it (*guard*), which resources the request
owns while in it (*holds*) and what leaving it requires (*cleanup*).

``STATE_TABLE`` and ``TRANSITIONS`` are the single source the book draws its diagram and table from.
``RequestLifecycle`` enforces them for one request. Terminal states are entered only through
``reclaim``, the one cleanup routine every terminal path shares: it decrefs KV blocks through
``BlockAllocator.free`` (a shared block returns to the pool with its last holder), rolls back a
reservation, releases the batch slot and host swap space, and writes exactly one ``TerminalRecord``.
A second call (cancel and timeout racing) is a no-op that returns False: the first terminal state
wins.

System boundary: this module keeps bookkeeping only. Times are seconds on whatever clock the caller
uses; the engine performs the actual KV copies and closes the client stream.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from servelab._validate import require_int, require_real
from servelab.kv import BlockAllocator
from servelab.lifecycle.ledger import Ledger, TerminalRecord, Usage
from servelab.lifecycle.states import RequestState, Resource

__all__ = [
    "RequestState",
    "Resource",
    "StateInfo",
    "STATE_TABLE",
    "TRANSITIONS",
    "TERMINAL_STATES",
    "IllegalTransition",
    "RequestLifecycle",
    "SlotPool",
    "Usage",
    "TerminalRecord",
    "Ledger",
    "reclaim",
]


@dataclass(frozen=True)
class StateInfo:
    """One row of the state table.

    ``summary``: what the state means. ``guard``: what must be true to enter it. ``holds``: the
    resources owned while in it. ``cleanup``: what leaving it for a terminal state must release.
    ``terminal``: no way out.
    """

    summary: str
    guard: str
    holds: tuple[Resource, ...]
    cleanup: str
    terminal: bool


_R = Resource
_RUNNING_HOLDS = (_R.KV_RESERVATION, _R.KV_BLOCKS, _R.BATCH_SLOT, _R.STREAM_BUFFER)
_RUNNING_CLEANUP = (
    "decref every KV block (a shared block returns with its last holder), drop the remaining "
    "reservation, release the batch slot, discard unsent text"
)
_TERMINAL_CLEANUP = "none: reclaim already released everything and wrote the one terminal record"

STATE_TABLE: dict[RequestState, StateInfo] = {
    RequestState.ARRIVED: StateInfo(
        summary="at the ingress gate: received, not yet checked or tokenized",
        guard="the request reached the server",
        holds=(),
        cleanup="nothing to release",
        terminal=False,
    ),
    RequestState.VALIDATED: StateInfo(
        summary="tokenized and validated; prompt and prefix-miss lengths known; awaits admission",
        guard="ingress gate passed (body size, rate limit, tenant quota) and the prompt tokenized "
        "to a valid length; prefix lookup gave the miss length",
        holds=(),
        cleanup="nothing to release: token ids are request metadata",
        terminal=False,
    ),
    RequestState.QUEUED: StateInfo(
        summary="admitted with a KV reservation (bookkeeping); waits for a tick to pick it",
        guard="scheduler admission passed: KV headroom, max_num_seqs, max_batched_tokens and "
        "tenant "
        "quota allow it, and its KV reservation under the engine's admission rule succeeded",
        holds=(_R.KV_RESERVATION,),
        cleanup="roll back the reservation (no physical blocks exist)",
        terminal=False,
    ),
    RequestState.DEGRADED: StateInfo(
        summary="admitted with a reduced allowance and a smaller reservation; waits for a tick",
        guard="full admission failed but a reduced allowance (fewer samples, shorter output) "
        "fits a "
        "smaller reservation that succeeded",
        holds=(_R.KV_RESERVATION,),
        cleanup="roll back the smaller reservation (no physical blocks exist)",
        terminal=False,
    ),
    RequestState.PREFILL: StateInfo(
        summary="runnable: picked by a tick, blocks allocated, computing the missed prompt tokens",
        guard="a scheduler tick picked it: batch slot acquired and physical blocks allocated for "
        "the "
        "prompt (from its reservation; cached prefix blocks shared)",
        holds=(_R.KV_RESERVATION, _R.KV_BLOCKS, _R.BATCH_SLOT),
        cleanup="decref every KV block, drop the remaining reservation, release the batch slot",
        terminal=False,
    ),
    RequestState.DECODE: StateInfo(
        summary="first token sampled from the last prefill pass; one new token per step",
        guard="the last prefill pass computed the last prompt token and the first token was "
        "sampled "
        "from its logits",
        holds=_RUNNING_HOLDS,
        cleanup=_RUNNING_CLEANUP,
        terminal=False,
    ),
    RequestState.BACKPRESSURED: StateInfo(
        summary="generation paused: the client reads slower than tokens are produced; KV kept",
        guard="the bounded stream buffer is full: the client reads slower than tokens are produced",
        holds=_RUNNING_HOLDS,
        cleanup=_RUNNING_CLEANUP,
        terminal=False,
    ),
    RequestState.PREEMPTED: StateInfo(
        summary="evicted under KV pressure by dropping its KV; waits to prefill again (recompute)",
        guard="chosen as a victim under KV pressure; its blocks were decref'd, its reservation and "
        "batch slot released (recompute preemption)",
        holds=(_R.STREAM_BUFFER,),
        cleanup="discard unsent text; no KV, reservation or slot is held",
        terminal=False,
    ),
    RequestState.SWAPPED: StateInfo(
        summary="evicted under KV pressure by moving its KV to host memory; waits to swap back in",
        guard="chosen as a victim under KV pressure; its KV was copied to host memory, then its "
        "blocks were decref'd and its reservation and batch slot released",
        holds=(_R.HOST_SWAP, _R.STREAM_BUFFER),
        cleanup="release the host swap space, discard unsent text",
        terminal=False,
    ),
    RequestState.FINISHED: StateInfo(
        summary="ended normally: a stop condition fired",
        guard="a stop condition fired: EOS, stop token or string, max_new_tokens, context limit, "
        "or "
        "a grammar's final state",
        holds=(),
        cleanup=_TERMINAL_CLEANUP,
        terminal=True,
    ),
    RequestState.REJECTED: StateInfo(
        summary="refused at the ingress gate or at scheduler admission; never held KV blocks",
        guard="the ingress gate or validation refused it, or scheduler admission could not reserve "
        "even a degraded allowance",
        holds=(),
        cleanup=_TERMINAL_CLEANUP,
        terminal=True,
    ),
    RequestState.CANCELLED: StateInfo(
        summary="the client cancelled or disconnected",
        guard="the client cancelled explicitly or disconnected",
        holds=(),
        cleanup=_TERMINAL_CLEANUP,
        terminal=True,
    ),
    RequestState.TIMED_OUT: StateInfo(
        summary="its deadline passed while queued or executing",
        guard="its deadline passed while queued or executing",
        holds=(),
        cleanup=_TERMINAL_CLEANUP,
        terminal=True,
    ),
    RequestState.FAILED: StateInfo(
        summary="the worker serving it crashed or raised",
        guard="the worker serving it crashed or raised an uncaught error",
        holds=(),
        cleanup=_TERMINAL_CLEANUP,
        terminal=True,
    ),
}

_S = RequestState
_ABORT = frozenset({_S.CANCELLED, _S.TIMED_OUT, _S.FAILED})
_EVICT = frozenset({_S.PREEMPTED, _S.SWAPPED})

TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    _S.ARRIVED: frozenset({_S.VALIDATED, _S.REJECTED, _S.CANCELLED, _S.FAILED}),
    # VALIDATED -> TIMED_OUT: a deadline that passes before admission (the engine's waiting queue)
    _S.VALIDATED: frozenset({_S.QUEUED, _S.DEGRADED, _S.REJECTED}) | _ABORT,
    _S.QUEUED: frozenset({_S.PREFILL}) | _ABORT,
    _S.DEGRADED: frozenset({_S.PREFILL}) | _ABORT,
    # PREFILL -> FINISHED: the first token, sampled from the last prefill pass, already met a stop
    # condition (EOS, or max_new_tokens == 1)
    _S.PREFILL: frozenset({_S.DECODE, _S.FINISHED}) | _EVICT | _ABORT,
    _S.DECODE: frozenset({_S.FINISHED, _S.BACKPRESSURED}) | _EVICT | _ABORT,
    _S.BACKPRESSURED: frozenset({_S.DECODE}) | _EVICT | _ABORT,
    # recompute: the prompt plus the tokens generated so far are prefilled again
    _S.PREEMPTED: frozenset({_S.PREFILL}) | _ABORT,
    # swap-in (resume) with fresh blocks: back to the stage it was swapped out of
    _S.SWAPPED: frozenset({_S.PREFILL, _S.DECODE}) | _ABORT,
    _S.FINISHED: frozenset(),
    _S.REJECTED: frozenset(),
    _S.CANCELLED: frozenset(),
    _S.TIMED_OUT: frozenset(),
    _S.FAILED: frozenset(),
}

TERMINAL_STATES: frozenset[RequestState] = frozenset(
    state for state, info in STATE_TABLE.items() if info.terminal
)


class IllegalTransition(ValueError):
    """A transition the state machine does not allow; the message names both states."""


def _check_state(state: object, name: str) -> RequestState:
    if not isinstance(state, RequestState):
        raise TypeError(f"{name} must be a RequestState, got {type(state).__name__}")
    return state


class RequestLifecycle:
    """The current state of one request plus its history of ``(state, time)`` entries.

    Starts in ARRIVED, or in the non-terminal ``state`` it was first observed in: the engine reads a
    request's state off its scheduler (``servelab.engine.request.lifecycle_state``) and builds a
    lifecycle in that state when the request ends, so its end goes through ``reclaim`` too.
    ``transition`` moves between non-terminal states along ``TRANSITIONS``; terminal states are
    entered only by ``reclaim`` so that no request ends without its cleanup. Times must not go
    backwards. Thread-safe: a lock serialises transitions and reclaim.
    """

    def __init__(
        self, request_id: Hashable, at: float = 0.0, state: RequestState = RequestState.ARRIVED
    ) -> None:
        if request_id is None or not isinstance(request_id, Hashable):
            raise TypeError(f"request_id must be a hashable, non-None id, got {request_id!r}")
        if STATE_TABLE[_check_state(state, "state")].terminal:
            raise ValueError(
                f"state must be a non-terminal state (a request ends through reclaim), got "
                f"{state.name}"
            )
        self._request_id = request_id
        self._history: list[tuple[RequestState, float]] = [(state, float(require_real("at", at)))]
        self._lock = threading.RLock()

    @property
    def request_id(self) -> Hashable:
        """The id the terminal record, batch slot and host swap space are keyed by."""
        return self._request_id

    @property
    def state(self) -> RequestState:
        """The state the request is in now."""
        return self._history[-1][0]

    @property
    def is_terminal(self) -> bool:
        """True once ``reclaim`` has ended the request."""
        return STATE_TABLE[self.state].terminal

    @property
    def history(self) -> tuple[tuple[RequestState, float], ...]:
        """Every state entered, oldest first, with the time it was entered."""
        return tuple(self._history)

    def transition(self, to: RequestState, at: float) -> None:
        """Move to the non-terminal state ``to`` at time ``at`` (seconds).

        Raises IllegalTransition naming both states when ``TRANSITIONS`` forbids the move or when
        ``to`` is terminal (use ``reclaim``), and ValueError when ``at`` is earlier than the last
        entry.
        """
        to = _check_state(to, "to")
        at = float(require_real("at", at))
        with self._lock:
            if STATE_TABLE[to].terminal and to in TRANSITIONS[self.state]:
                raise IllegalTransition(
                    f"{self.state.name} -> {to.name} enters a terminal state: call "
                    f"reclaim() so the "
                    "request's resources are released and its terminal record is written"
                )
            self._check_move(to, at)
            self._history.append((to, at))

    def end(self, to: RequestState, at: float, cleanup: Callable[[RequestState], None]) -> bool:
        """Enter the terminal state ``to`` at ``at`` after ``cleanup(from_state)`` has run,
        atomically.

        The one way into a terminal state, used by ``reclaim``: under the lock it checks the move
        (IllegalTransition / ValueError before anything runs), calls ``cleanup`` with the state
        being left (it releases resources and writes the terminal record), then records ``to``.
        Returns False, running nothing, when the request has already ended (a racing cancel and
        timeout).
        """
        to = _check_state(to, "to")
        at = float(require_real("at", at))
        with self._lock:
            if self.is_terminal:
                return False
            self._check_move(to, at)
            cleanup(self.state)
            self._history.append((to, at))
            return True

    def _check_move(self, to: RequestState, at: float) -> None:
        if to not in TRANSITIONS[self.state]:
            allowed = (
                ", ".join(sorted(s.name for s in TRANSITIONS[self.state])) or "none (terminal)"
            )
            raise IllegalTransition(
                f"illegal transition {self.state.name} -> {to.name} for request "
                f"{self._request_id!r}; allowed from {self.state.name}: {allowed}"
            )
        last = self._history[-1][1]
        if at < last:
            raise ValueError(f"at must be >= {last} (time of entering {self.state.name}), got {at}")

    def __repr__(self) -> str:
        return f"RequestLifecycle({self._request_id!r}, state={self.state.name})"


class SlotPool:
    """A counted pool of identical units owned per request: batch slots, or host swap blocks.

    ``acquire`` is all-or-nothing; ``release`` returns everything an owner holds and is idempotent.
    """

    def __init__(self, capacity: int) -> None:
        require_int("capacity", capacity, 1)
        self._capacity = capacity
        self._held: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        """Units in the pool."""
        return self._capacity

    @property
    def in_use(self) -> int:
        """Units held by some owner."""
        return sum(self._held.values())

    @property
    def available(self) -> int:
        """Units nobody holds."""
        return self._capacity - self.in_use

    def held_by(self, owner: Hashable) -> int:
        """Units ``owner`` holds now (0 if none)."""
        return self._held.get(owner, 0)

    def acquire(self, owner: Hashable, n: int = 1) -> bool:
        """Give ``owner`` ``n`` more units; False and no change when fewer than ``n`` are
        available."""
        if owner is None or not isinstance(owner, Hashable):
            raise TypeError(f"owner must be a hashable, non-None id, got {owner!r}")
        require_int("n", n, 1)
        with self._lock:
            if n > self._capacity - sum(self._held.values()):
                return False
            self._held[owner] = self._held.get(owner, 0) + n
            return True

    def release(self, owner: Hashable) -> int:
        """Return every unit ``owner`` holds; returns how many (0 for an unknown or released
        owner)."""
        with self._lock:
            return self._held.pop(owner, 0)


def reclaim(
    lifecycle: RequestLifecycle,
    terminal_state: RequestState,
    *,
    ledger: Ledger,
    at: float,
    reason: str = "",
    allocator: BlockAllocator | None = None,
    seq_ids: Iterable[Hashable] = (),
    slots: SlotPool | None = None,
    host_swap: SlotPool | None = None,
    usage: Usage | None = None,
) -> bool:
    """End a request: release everything it holds and write its one terminal record.

    The routine shared by FINISHED, CANCELLED, TIMED_OUT, FAILED (and REJECTED, which holds
    nothing):

    1. for every sequence id of the request (a best-of-n request has several), roll back what is
       left of its KV reservation and decref its blocks through ``allocator.free``; a block shared
       with a prefix or a sibling returns to the pool only when its last holder frees it. A request
       still in QUEUED/DEGRADED has a reservation and no blocks, so only the reservation is rolled
       back;
    2. release its batch slots (``slots``) and host swap space (``host_swap``), keyed by request id
       or by any of its ``seq_ids`` (an engine running n samples holds one slot per sample
       sequence);
    3. move the lifecycle to ``terminal_state`` at ``at`` and append one ``TerminalRecord`` to
       ``ledger``.

    Returns True when this call ended the request, False when it had already ended (a racing cancel
    and timeout): then nothing changes and the first terminal state stands. Raises IllegalTransition
    (before touching anything) when the current state cannot reach ``terminal_state``.
    """
    if not isinstance(lifecycle, RequestLifecycle):
        raise TypeError(f"lifecycle must be a RequestLifecycle, got {type(lifecycle).__name__}")
    terminal_state = _check_state(terminal_state, "terminal_state")
    if not STATE_TABLE[terminal_state].terminal:
        allowed = ", ".join(sorted(s.name for s in TERMINAL_STATES))
        raise ValueError(f"terminal_state must be one of {allowed}, got {terminal_state.name}")
    if not isinstance(ledger, Ledger):
        raise TypeError(f"ledger must be a Ledger, got {type(ledger).__name__}")
    at = float(require_real("at", at))
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a str, got {type(reason).__name__}")
    if allocator is not None and not isinstance(allocator, BlockAllocator):
        raise TypeError(
            f"allocator must be a BlockAllocator or None, got {type(allocator).__name__}"
        )
    seq_ids = tuple(seq_ids)
    if seq_ids and allocator is None:
        raise ValueError(
            "seq_ids were given but allocator is None: pass the allocator that holds them"
        )
    for name, pool in (("slots", slots), ("host_swap", host_swap)):
        if pool is not None and not isinstance(pool, SlotPool):
            raise TypeError(f"{name} must be a SlotPool or None, got {type(pool).__name__}")
    if usage is None:
        usage = Usage()
    elif not isinstance(usage, Usage):
        raise TypeError(f"usage must be a Usage or None, got {type(usage).__name__}")

    def release_and_record(from_state: RequestState) -> None:
        if ledger.has(lifecycle.request_id):
            raise ValueError(f"ledger already holds a terminal record for {lifecycle.request_id!r}")
        reserved = blocks = 0
        for seq_id in seq_ids:
            reserved += allocator.release_reservation(seq_id)
            blocks += allocator.free(seq_id)
        owners = (lifecycle.request_id, *seq_ids)  # a best-of-n engine may key them by sequence
        slot_count = sum(slots.release(o) for o in owners) if slots is not None else 0
        swap_count = sum(host_swap.release(o) for o in owners) if host_swap is not None else 0
        ledger.append(
            TerminalRecord(
                request_id=lifecycle.request_id,
                state=terminal_state,
                reason=reason,
                at=at,
                usage=usage,
                from_state=from_state,
                blocks_freed=blocks,
                reservation_released=reserved,
                slots_released=slot_count,
                swap_released=swap_count,
            )
        )

    return lifecycle.end(terminal_state, at, release_and_record)
