"""What a handler holds of one request in flight: its bounded output stream, the backpressure rule
that stream is read under, and the errors that end a request before the engine finishes it.

:class:`RequestStream` is filled by the engine thread of
:class:`~servelab.server.bridge.EngineBridge` and read by one asyncio handler;
:class:`BackpressurePolicy` is the rule the bridge applies to it (and the §1 notebook replays step
by step). The errors map to HTTP statuses in :mod:`servelab.server.responses`.

System boundary: one stream's buffer and the thread hand-off; times are whatever unit the caller
uses (the bridge: ``time.monotonic`` seconds).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from servelab.engine import RequestOutput

__all__ = [
    "BridgeError",
    "InvalidRequest",
    "QueueTimeout",
    "SlowClient",
    "EngineFailure",
    "Overloaded",
    "BackpressurePolicy",
    "RequestStream",
]


class BridgeError(Exception):
    """Why the bridge ended a request instead of the engine finishing it."""


class InvalidRequest(BridgeError):
    """The engine refused the request in ``add_request`` (HTTP 400)."""


class QueueTimeout(BridgeError):
    """The request waited in the queue past its queueing deadline and was cancelled (HTTP 503).

    ``retry_after_s`` is the bridge's estimate of the current queueing delay (at least 1 s).
    """

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SlowClient(BridgeError):
    """The client stopped reading: its stream buffer stayed full past the backpressure timeout, so
    the paused request was cancelled."""


class EngineFailure(BridgeError):
    """The engine thread crashed or the server is shutting down (HTTP 500 / 503)."""


class Overloaded(Exception):
    """Refused at submission: the queue is full or the request would miss its deadline (HTTP
    503)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class BackpressurePolicy:
    """The rule that decides when a slow reader's request is paused, resumed or given up on.

    ``capacity``: undelivered outputs one stream may hold; the request is paused when its buffer is
    full and resumed once the reader has drained it to half. ``timeout``: how long a paused request
    may wait before it is cancelled. The rule does not care about the unit of time: the bridge
    applies it in wall-clock seconds, the §1 notebook replays it in engine steps.
    """

    capacity: int
    timeout: float

    def should_pause(self, buffered: int) -> bool:
        """The buffer is full: stop producing for this reader."""
        return buffered >= self.capacity

    def should_resume(self, buffered: int) -> bool:
        """A paused reader has caught up to half the buffer: produce again."""
        return buffered <= self.capacity // 2

    def should_give_up(self, paused_for: float) -> bool:
        """A request paused for longer than ``timeout`` is cancelled, so a vanished reader cannot
        hold KV."""
        return paused_for > self.timeout


class RequestStream:
    """A bounded buffer of one request's outputs, filled by the engine thread, read by one handler.

    :meth:`offer` (engine thread) refuses a non-final output once ``policy.capacity`` outputs are
    unread; :meth:`close` (engine thread) always appends the final item, an output or a
    :class:`BridgeError`, so the buffer never holds more than ``capacity + 1`` items.
    """

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop, policy: BackpressurePolicy,
                 on_drain: Callable[[str], None] | None = None) -> None:
        self.request_id = request_id
        self._loop = loop
        self._policy = policy
        self._on_drain = on_drain  # called (loop thread) when a paused stream has drained to half
        self._items: deque[RequestOutput | BridgeError] = deque()
        self._lock = threading.Lock()
        self._ready = asyncio.Event()  # set only from the loop thread
        self.closed = False
        self.paused = False  # the engine was told to pause this request; guarded by _lock

    @property
    def full(self) -> bool:
        """True when the policy's ``capacity`` outputs are waiting for the reader (time to
        pause)."""
        with self._lock:
            return self._policy.should_pause(len(self._items))

    def mark_paused(self) -> None:
        """Record that the request was paused; the reader's drain will ask for a resume."""
        with self._lock:
            self.paused = True

    def offer(self, output: RequestOutput) -> bool:
        """Append a non-final output; False (nothing appended) when the buffer is full."""
        with self._lock:
            if self._policy.should_pause(len(self._items)):
                return False
            self._items.append(output)
        self._wake()
        return True

    def close(self, final: RequestOutput | BridgeError) -> None:
        """Append the last item: a finished output or the error that ended the request."""
        with self._lock:
            self._items.append(final)
            self.closed = True
        self._wake()

    def _wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # the event loop is closed: nobody is reading any more
            pass

    async def next(self) -> RequestOutput:
        """The next output, waiting for it; raises the :class:`BridgeError` that ended the
        request."""
        while True:
            with self._lock:
                if self._items:
                    item = self._items.popleft()
                    break
                self._ready.clear()
            await self._ready.wait()
        self._resume_if_drained()
        if isinstance(item, BridgeError):
            raise item
        return item

    def _resume_if_drained(self) -> None:
        with self._lock:
            drained = self.paused and self._policy.should_resume(len(self._items))
            if drained:
                self.paused = False
        if drained and self._on_drain is not None:
            self._on_drain(self.request_id)
