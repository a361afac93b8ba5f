"""The bridge between the synchronous engine and the asyncio HTTP handlers.

The engine is not thread-safe, and one ``step()`` blocks for a whole forward pass, so exactly one
background thread owns it. Handlers never touch the engine: they send commands (add, cancel, call)
through a thread-safe queue, and read the engine's outputs from a per-request
:class:`RequestStream`. Between two steps the engine thread applies the commands, so a cancel (an
explicit one, or a client disconnect noticed by the handler) frees the request's KV blocks before
the next forward pass.

Phase 2 of admission that is the server's job lives here:

* the queue in front of the engine is bounded (``max_waiting`` requests not yet scheduled); a
  request that finds it full is refused at once (:class:`Overloaded`, HTTP 503 with Retry-After) --
  never an unbounded queue;
* a request that would have to queue for longer than its own deadline, judged by the recent queueing
  delay, is refused the same way;
* a request still unscheduled ``queue_timeout_s`` after it was submitted is cancelled and ends with
  :class:`QueueTimeout` (503): the queueing deadline.

The KV reservation itself is the engine scheduler's admission step.

Backpressure policy: each stream buffers at most ``stream_capacity`` undelivered outputs. A client
that reads slower than tokens are generated first fills the socket, then this buffer; when the
buffer is full the engine thread **pauses** the request (``LLMEngine.pause``: descheduled,
BACKPRESSURED; it keeps its KV blocks but stops taking compute from readers that keep up). Once the
reader has drained the buffer to half, the request is resumed where it stopped. A reader that stays
away for ``backpressure_timeout_s`` is given up on: the request is cancelled (its KV freed) and the
stream ends with :class:`SlowClient`, so a client that never comes back cannot hold KV forever. The
three decisions are one small object, :class:`BackpressurePolicy`, which the §1 notebook replays
step by step.

System boundary: thread hand-off only; times are ``time.monotonic`` seconds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servelab._validate import require_real
from servelab.engine import LLMEngine, RequestOutput
from servelab.engine.sequence import StepOutputs
from servelab.sampling import SamplingParams
from servelab.server.streams import (
    BackpressurePolicy,
    BridgeError,
    EngineFailure,
    InvalidRequest,
    Overloaded,
    QueueTimeout,
    RequestStream,
    SlowClient,
)

if TYPE_CHECKING:
    from servelab.server.metrics import ServerMetrics

__all__ = [
    "BridgeError",
    "InvalidRequest",
    "QueueTimeout",
    "SlowClient",
    "EngineFailure",
    "Overloaded",
    "BackpressurePolicy",
    "RequestStream",
    "EngineBridge",
]


@dataclass
class _Tracked:
    """Engine-thread bookkeeping of one submitted request."""

    stream: RequestStream
    submitted: float
    tenant: str = ""
    started: bool = False
    paused_at: float | None = None  # time.monotonic() when backpressure paused it
    generated: int = 0  # tokens generated so far (as of the last output)
    last_token_at: float | None = None  # time.monotonic() of the last output with new tokens


@dataclass
class _Command:
    kind: str  # "add", "cancel", "resume", "call" or "stop"
    request_id: str = ""
    args: tuple = ()
    future: concurrent.futures.Future | None = None
    tracked: _Tracked | None = field(default=None, repr=False)


class EngineBridge:
    """Runs ``engine`` in one background thread and connects it to asyncio handlers.

    ``max_waiting``: requests submitted but not yet scheduled that the bridge accepts (the bounded
    queue). ``queue_timeout_s``: how long one may stay unscheduled. ``stream_capacity``: undelivered
    outputs per request before backpressure pauses it. ``backpressure_timeout_s``: how long a paused
    request waits for its reader before it is cancelled. ``metrics``, when given, is told every
    admission, token, preemption and ending (:class:`~servelab.server.metrics.ServerMetrics`).
    """

    POLL_S = 0.05  # how often a bridge whose every request is paused checks its timers (seconds)

    def __init__(self, engine: LLMEngine, max_waiting: int = 64, queue_timeout_s: float = 10.0,
                 stream_capacity: int = 64, backpressure_timeout_s: float = 30.0,
                 metrics: ServerMetrics | None = None) -> None:
        if not isinstance(engine, LLMEngine):
            raise TypeError(f"engine must be an LLMEngine, got {type(engine).__name__}")
        for name, value in (("max_waiting", max_waiting), ("stream_capacity", stream_capacity)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if (isinstance(queue_timeout_s, bool) or not isinstance(queue_timeout_s, (int, float))
                or not queue_timeout_s > 0):
            raise ValueError(f"queue_timeout_s must be a number > 0, got {queue_timeout_s!r}")
        self.backpressure = BackpressurePolicy(stream_capacity, require_real(
            "backpressure_timeout_s", backpressure_timeout_s, 0, strict_min=True))
        self.engine = engine
        self.max_waiting = max_waiting
        self.queue_timeout_s = float(queue_timeout_s)
        self._commands: queue.Queue[_Command] = queue.Queue()
        self._waiting = 0  # submitted, not yet scheduled; guarded by _lock
        self._closed = False  # set (under _lock) once the engine thread stops taking commands
        self._lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}  # engine thread only
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.queue_delay_ewma_s = 0.0  # recent submit -> first scheduled delay (seconds)
        self.failure: BaseException | None = None
        self.metrics = metrics

    # ------------------------------------------------------------------------ event-loop side

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the engine thread; streams wake handlers on ``loop``."""
        if self._thread is not None:
            raise RuntimeError("the bridge is already started")
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="servelab-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel every request in flight, end their streams, and stop the engine thread."""
        if self._thread is None:
            return
        self._commands.put(_Command("stop"))
        self._thread.join(timeout_s)
        self._thread = None

    @property
    def alive(self) -> bool:
        """True while the engine thread runs and has not failed."""
        return self._thread is not None and self._thread.is_alive() and self.failure is None

    @property
    def num_waiting(self) -> int:
        """Requests submitted and not yet scheduled (the bounded queue's length)."""
        with self._lock:
            return self._waiting

    def submit(self, prompt_ids: list[int], params: SamplingParams, deadline_s: float | None = None,
               namespace: str = "") -> RequestStream:
        """Queue a request for the engine; returns its stream. Raises :class:`Overloaded` when
        refused.

        ``deadline_s`` (seconds from now) is handed to the engine, which ends the request as timed
        out when it passes. ``namespace`` isolates the prefix cache (the tenant).
        """
        retry = max(1.0, self.queue_delay_ewma_s)
        request_id = f"srv-{uuid.uuid4().hex[:16]}"  # unique across bridges sharing an engine
        stream = RequestStream(request_id, self._loop, self.backpressure, on_drain=self.resume)
        tracked = _Tracked(stream, time.monotonic(), namespace)
        # checked and queued under the lock, so a stopping engine thread still answers it
        with self._lock:
            if self._closed or self._thread is None:
                raise EngineFailure("the engine is not running")
            if self._waiting >= self.max_waiting:
                raise Overloaded(f"the queue is full ({self.max_waiting} requests waiting)", retry)
            if (
                deadline_s is not None
                and self._waiting > 0
                and self.queue_delay_ewma_s > deadline_s
            ):
                raise Overloaded(
                    f"the recent queueing delay ({self.queue_delay_ewma_s:.2f} s) exceeds this "
                    f"request's deadline ({deadline_s:g} s)",
                    retry,
                )
            self._waiting += 1
            self._commands.put(
                _Command(
                    "add", request_id, (prompt_ids, params, deadline_s, namespace), tracked=tracked
                )
            )
        return tracked.stream

    def cancel(self, request_id: str) -> None:
        """Ask the engine thread to cancel ``request_id``; a no-op once it has ended
        (idempotent)."""
        self._commands.put(_Command("cancel", request_id))

    def resume(self, request_id: str) -> None:
        """Ask the engine thread to resume a request that backpressure paused (its reader caught
        up)."""
        self._commands.put(_Command("resume", request_id))

    async def call(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """Run ``fn(engine)`` on the engine thread between two steps and return its result."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed or self._thread is None:
                raise EngineFailure("the engine is not running")
            self._commands.put(_Command("call", args=(fn,), future=future))
        return await asyncio.wrap_future(future)

    # ------------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        try:
            while self._apply(self._next_commands()):
                self._expire_queue()
                self._expire_backpressure()
                # while all are paused, a cheap step that checks deadlines
                if self.engine.has_unfinished():
                    step_start = time.monotonic()
                    outputs = self.engine.step()
                    # first: admitted and finished in one step counts
                    self._mark_started(step_start, outputs.admitted)
                    self._count_step(outputs)
                    self._deliver(outputs.outputs)
        except Exception as exc:  # a crashed engine fails every request in flight (FAILED path)
            self.failure = exc
            self._end_all(EngineFailure(f"the engine failed: {exc!r}"))
            return
        self._end_all(EngineFailure("the server is shutting down"))

    def _next_commands(self) -> list[_Command]:
        """Wait for a command when there is nothing to step; while every request is paused, wait at
        most ``POLL_S`` so the engine still checks deadlines without spinning."""
        if not self.engine.has_unfinished():
            return self._drain(block=True)
        return (
            self._drain(block=True, timeout=self.POLL_S)
            if self._all_paused()
            else self._drain(False)
        )

    def _all_paused(self) -> bool:
        return bool(self._tracked) and all(t.paused_at is not None for t in self._tracked.values())

    def _drain(self, block: bool, timeout: float | None = None) -> list[_Command]:
        commands = []
        if block:
            try:
                commands.append(self._commands.get(timeout=timeout))
            except queue.Empty:
                return commands
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _apply(self, commands: list[_Command]) -> bool:
        """Apply commands in order; False when a stop command was among them."""
        running = True
        for command in commands:
            if command.kind == "stop":
                running = False
            elif command.kind == "add":
                self._add(command)
            elif command.kind == "cancel":
                self._cancel(command.request_id, None)
            elif command.kind == "resume":
                self._resume(command.request_id)
            elif command.kind == "call":
                try:
                    command.future.set_result(command.args[0](self.engine))
                except Exception as exc:
                    command.future.set_exception(exc)
        return running

    def _add(self, command: _Command) -> None:
        prompt_ids, params, deadline_s, namespace = command.args
        try:
            self.engine.add_request(
                prompt_ids,
                params,
                request_id=command.request_id,
                deadline_s=deadline_s,
                namespace=namespace,
            )
        except (ValueError, TypeError) as exc:
            self._unqueue()
            command.tracked.stream.close(InvalidRequest(str(exc)))
            return
        self._tracked[command.request_id] = command.tracked
        if self.metrics is not None:
            self.metrics.tokens(command.tracked.tenant, prompt=len(prompt_ids))

    def _cancel(self, request_id: str, error: BridgeError | None) -> None:
        """Cancel in the engine (frees its KV now) and end the stream with ``error`` if given."""
        tracked = self._tracked.pop(request_id, None)
        if tracked is None:
            return  # already ended, or never added
        self.engine.cancel(request_id)
        self._observe_end(tracked, "cancelled")
        if not tracked.started:
            self._unqueue()
        if error is not None:
            tracked.stream.close(error)

    def _pause(self, request_id: str, tracked: _Tracked) -> None:
        """Backpressure: deschedule the request (it keeps its KV) until its reader drains the
        buffer."""
        tracked.stream.mark_paused()
        tracked.paused_at = time.monotonic()
        self.engine.pause(request_id)

    def _resume(self, request_id: str) -> None:
        tracked = self._tracked.get(request_id)
        if tracked is None or tracked.paused_at is None:
            return  # ended meanwhile, or never paused
        tracked.paused_at = None
        self.engine.resume(request_id)

    def _expire_backpressure(self) -> None:
        now = time.monotonic()
        for request_id, tracked in list(self._tracked.items()):
            if tracked.paused_at is not None and self.backpressure.should_give_up(
                now - tracked.paused_at
            ):
                self._cancel(request_id, SlowClient(
                    f"the client left {self.backpressure.capacity} chunks unread for "
                    f"{self.backpressure.timeout:g} s; request cancelled"))

    def _unqueue(self) -> None:
        with self._lock:
            self._waiting -= 1

    def _expire_queue(self) -> None:
        now = time.monotonic()
        for request_id, tracked in list(self._tracked.items()):
            if not tracked.started and now - tracked.submitted > self.queue_timeout_s:
                self._cancel(request_id, QueueTimeout(
                    f"not scheduled within the queueing deadline of {self.queue_timeout_s:g} s",
                    max(1.0, self.queue_delay_ewma_s)))

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            tracked = self._tracked.get(output.request_id)
            if tracked is None:
                continue  # the final output of a request the bridge itself cancelled
            self._observe_tokens(tracked, output)
            if output.finished:
                del self._tracked[output.request_id]
                self._observe_end(tracked, output.finish_reason)
                if not tracked.started:
                    self._unqueue()
                tracked.stream.close(output)
            elif output.delta:
                # only if a paused request still produced output
                if not tracked.stream.offer(output):
                    self._cancel(
                        output.request_id,
                        SlowClient(
                            f"the client left {self.backpressure.capacity} chunks unread; "
                            f"request cancelled"
                        ),
                    )
                elif tracked.stream.full and tracked.paused_at is None:
                    self._pause(output.request_id, tracked)

    def _mark_started(self, step_start: float, admitted: tuple[str, ...]) -> None:
        """Requests the step admitted (``admitted``: request ids) have been scheduled (at
        ``step_start``): they leave the bound."""
        for request_id in admitted:
            tracked = self._tracked.get(request_id)
            if tracked is not None and not tracked.started:
                tracked.started = True
                self._unqueue()
                delay = step_start - tracked.submitted
                self.queue_delay_ewma_s = 0.8 * self.queue_delay_ewma_s + 0.2 * delay
                if self.metrics is not None:
                    self.metrics.queue_time.observe(delay)

    def _count_step(self, outputs: StepOutputs) -> None:
        """A step's preemptions and, when it ran a forward pass, its batched tokens."""
        if self.metrics is None:
            return
        if outputs.num_preempted:
            self.metrics.preemptions.inc(outputs.num_preempted)
        if outputs.num_batched_tokens:
            self.metrics.iteration_tokens.observe(outputs.num_batched_tokens)

    def _observe_tokens(self, tracked: _Tracked, output: RequestOutput) -> None:
        """Count new tokens; the first output with any is the TTFT, later ones inter-token gaps."""
        new = output.usage.generated_tokens - tracked.generated
        if self.metrics is None or new <= 0:
            return
        now = time.monotonic()
        tracked.generated = output.usage.generated_tokens
        self.metrics.tokens(tracked.tenant, generated=new)
        if tracked.last_token_at is None:
            self.metrics.ttft.observe(now - tracked.submitted)
            self.metrics.prefix_cache_queries.inc(output.usage.prompt_tokens)
            self.metrics.prefix_cache_hits.inc(output.usage.cached_prompt_tokens)
        else:
            self.metrics.itl.observe(now - tracked.last_token_at)
        tracked.last_token_at = now

    def _observe_end(self, tracked: _Tracked, engine_reason: str | None) -> None:
        if self.metrics is not None:
            self.metrics.finished(engine_reason, time.monotonic() - tracked.submitted)

    def _end_all(self, error: BridgeError) -> None:
        """Refuse new commands, end every open stream with ``error``; cancel their requests if the
        engine still works."""
        with self._lock:
            self._closed = True
        for request_id, tracked in list(self._tracked.items()):
            del self._tracked[request_id]
            if not tracked.started:
                self._unqueue()
            self._observe_end(tracked, "failed" if self.failure is not None else "cancelled")
            tracked.stream.close(error)
            if self.failure is None:
                self.engine.cancel(request_id)
        while True:  # answer commands that arrived too late
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command.kind == "add":
                self._unqueue()
                command.tracked.stream.close(error)
            elif command.kind == "call":
                command.future.set_exception(error)
