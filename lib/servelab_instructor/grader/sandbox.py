"""The grader's side of the isolated worker: start it, load a submission, call it, kill it.

:class:`Worker` starts :mod:`servelab_instructor.grader._worker`'s text with ``python -I -u -c`` in
a fresh empty temporary folder, in a session of its own, with a minimal environment (no
``PYTHONPATH``, no grading seed, no path to the grade sheet). A submission's functions and classes
are then reached through :class:`RemoteFunction` and :class:`RemoteClass`: a checker calls them
exactly as it would call the student's code, the arguments travel as plain data and the student's
answers come back as plain data, so the expected values stay in the grader's process. Every call is
logged in the current :class:`CaseLog` (what went in, what came out) for the grade sheet's notes.

A call that runs past its case's time limit is stopped inside the worker (``SIGALRM``,
``RLIMIT_CPU``); a worker that does not answer, or dies, is killed with its process group and
started again with the same statements, so one endless function costs only its own cases.

The worker runs inside the :class:`.isolation.Isolation` the grader chose (bubblewrap, or a uid of
its own). What the worker's audit hook refused, and a reply pipe carrying anything but replies
(garbage, a flood, an answer out of turn), lands in :attr:`Worker.denied`; the grader then scores
the exercise 0.
"""

from __future__ import annotations

import builtins
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from servelab_instructor.grader._worker import decode, encode
from servelab_instructor.grader.isolation import BUBBLEWRAP, NONE, SCRATCH, SEPARATE_UID, Isolation

__all__ = [
    "LIVE",
    "SPAWN_LOCK",
    "CaseLog",
    "Limits",
    "RemoteClass",
    "RemoteFunction",
    "StudentError",
    "Worker",
    "describe",
]

_SOURCE = (Path(__file__).with_name("_worker.py")).read_text(encoding="utf-8")
_GRACE = 2.0  # seconds a worker may take past a call's limit before it is killed
_MAX_RESTARTS = 50
_MAX_REPLY = 64 * 2**20  # bytes of one reply line; more is a flood
PIPE_ABUSE = "writing to the grader's reply pipe"
SPAWN_LOCK = threading.Lock()  # held while a worker starts and while the reaper sweeps
LIVE: set[int] = set()  # process ids of the workers running now (the reaper leaves them alone)


@dataclass(frozen=True)
class Limits:
    """Per-case limits: ``case_seconds`` of wall clock and CPU, ``memory_mib`` of address space for
    the worker, ``output_kib`` printed per call; ``load_seconds`` for running the notebook's
    definitions."""

    case_seconds: float = 10.0
    memory_mib: int = 4096
    output_kib: int = 1024
    load_seconds: float = 60.0


class StudentError(Exception):
    """The student's code raised, timed out, printed too much or used a refused import."""


@dataclass
class CaseLog:
    """What one case sent to the submission and got back, in order."""

    calls: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    denied: list[str] = field(default_factory=list)
    timed_out: bool = False
    output_limit: bool = False


def describe(value: object, width: int = 160) -> str:
    """A short readable form of an argument or a returned value (arrays rounded, tensors by
    shape)."""
    kind = type(value).__module__.split(".")[0], type(value).__name__
    if kind == ("torch", "Tensor"):
        text = f"tensor{list(value.shape)}"
    elif kind == ("numpy", "ndarray"):
        text = repr(
            [round(float(v), 4) for v in value.ravel()]
            if value.ndim == 1
            else value.round(4).tolist()
        )
    elif kind[1] == "RequestTiming":
        text = (
            f"RequestTiming(arrival={value.arrival:g}, "
            f"emit_times={[round(t, 4) for t in value.emit_times]}, "
            f"finish={value.finish:g})"
        )
    elif isinstance(value, list) and any(type(v).__name__ == "RequestTiming" for v in value):
        text = "[" + ", ".join(describe(v, width) for v in value) + "]"
        width = 4 * width
    else:
        text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


class Worker:
    """One submission's worker process; ``load`` it once, then call its names through the
    proxies."""

    def __init__(self, statements: list[str], allowed: dict[str, list[str]], limits: Limits,
                 isolation: Isolation = Isolation(NONE)) -> None:
        self.statements, self.allowed, self.limits, self.isolation = (
            statements,
            allowed,
            limits,
            isolation,
        )
        self.log = CaseLog()
        self.denied: list[str] = []  # everything refused over the worker's life, restarts included
        self._sequence = 0
        self._lost = ""  # why the last request got no reply
        self.case_started = time.monotonic()
        self.generation = 0
        self.restarts = 0
        self._process: subprocess.Popen | None = None

    # ----------------------------------------------------------------- process life

    def _spawn(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="servelab-grade-")
        out_path = tempfile.mkstemp(prefix="servelab-output-")
        os.close(out_path[0])
        output = os.open(out_path[1], os.O_WRONLY | os.O_APPEND)
        os.unlink(out_path[1])
        to_worker, from_grader = os.pipe()
        from_worker, to_grader = os.pipe()
        scratch = SCRATCH if self.isolation.kind == BUBBLEWRAP else self._folder.name
        uid = self.isolation.next_uid()
        if self.isolation.kind == SEPARATE_UID and uid is not None:
            os.chown(self._folder.name, uid, uid)
        nproc = 0 if self.isolation.kind == NONE else self.isolation.process_limit()
        limits = (self.limits.output_kib * 1024, self.limits.memory_mib * 2**20,
                  -1 if uid is None else uid, nproc)
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        argv = [
            sys.executable,
            "-I",
            "-u",
            "-c",
            _SOURCE,
            str(to_worker),
            str(to_grader),
            *map(str, limits),
            scratch,
        ]
        try:
            SPAWN_LOCK.acquire()
            self._process = subprocess.Popen(
                self.isolation.command(argv, env),
                cwd=self._folder.name,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                pass_fds=(to_worker, to_grader),
                start_new_session=True,
            )
            LIVE.add(self._process.pid)
        except BaseException:
            os.close(from_grader)
            os.close(from_worker)
            self._folder.cleanup()
            raise
        finally:
            SPAWN_LOCK.release()
            os.close(to_worker)
            os.close(to_grader)
            os.close(output)
        self._send, self._recv, self._buffer = (
            os.fdopen(from_grader, "w", encoding="utf-8"),
            from_worker,
            b"",
        )
        self.generation += 1

    def load(self) -> dict:
        """Start the worker and run the statements: ``{"kinds", "errors", "refused"}``."""
        self._spawn()
        reply = self._request({"op": "load", "statements": self.statements, "allowed": self.allowed,
                               "limit": self.limits.load_seconds}, self.limits.load_seconds)
        if reply is None:
            self.close()
            return {
                "kinds": {},
                "errors": [
                    f"the definitions did not finish within {self.limits.load_seconds:g} s "
                    "or killed the worker"
                ],
                "refused": [],
                "denied": [],
            }
        self.denied += reply.get("denied", [])
        return reply

    def close(self) -> None:
        """Kill the worker and everything in its session; safe to call twice."""
        if self._process is None:
            return
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._process.wait()
        LIVE.discard(self._process.pid)
        self._send.close()
        os.close(self._recv)
        self._folder.cleanup()
        self._process = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    # ----------------------------------------------------------------- requests

    def _request(self, request: dict, limit: float) -> dict | None:
        """Send one request; the reply, or None when the worker died, did not answer in time, or
        wrote something else than this request's reply on its pipe (then PIPE_ABUSE is in
        :attr:`denied`)."""
        self._sequence += 1
        try:
            self._send.write(json.dumps({**request, "id": self._sequence}) + "\n")
            self._send.flush()
        except (BrokenPipeError, OSError):
            self._lost = "ended its worker or closed the request pipe"
            return None
        deadline = time.monotonic() + limit + _GRACE
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._recv], [], [], left)[0]:
                self._lost = "did not return"
                return None
            chunk = os.read(self._recv, 1 << 20)
            if not chunk:
                self._lost = "ended its worker or closed the reply pipe"
                return None
            self._buffer += chunk
            if len(self._buffer) > _MAX_REPLY:
                return self._abused()
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError:
            return self._abused()
        if not isinstance(reply, dict) or reply.get("id") != self._sequence or self._buffer:
            return self._abused()
        return reply

    def _abused(self) -> None:
        """The reply pipe carried something else than the worker's replies: kill the worker, note
        it."""
        self.denied.append(PIPE_ABUSE)
        self.log.denied.append(PIPE_ABUSE)
        self.close()
        return None

    def start_case(self, rule: str) -> None:
        """A new case begins: a fresh log and a fresh time budget."""
        self.log, self.case_started = CaseLog(), time.monotonic()

    def call(self, request: dict, text: str) -> object:
        """Run one call under what is left of the case's time; the decoded answer, or
        StudentError."""
        if self._process is None and self.restarts < _MAX_RESTARTS:
            self.restarts += 1
            started = time.monotonic()
            self.load()
            self.case_started += time.monotonic() - started  # restarting is not the case's time
        left = self.limits.case_seconds - (time.monotonic() - self.case_started)
        if left <= 0 or self._process is None:
            self.log.timed_out = True
            raise StudentError(f"{text}: no time left in this case")
        abused = len(self.denied)
        reply = self._request({**request, "limit": left}, left)
        if reply is None and len(self.denied) > abused:
            self.log.calls.append(
                f"{text}: the worker's reply pipe carried something else than its answer"
            )
            raise StudentError(PIPE_ABUSE)
        if reply is None:
            self.close()
            if self._lost != "did not return":
                self.log.calls.append(f"{text} {self._lost}")
                raise StudentError(f"the call {self._lost}")
            self.log.timed_out = True
            self.log.calls.append(
                f"{text} did not return (stopped after {self.limits.case_seconds:g} s)"
            )
            raise StudentError("the call did not return within the case's time limit")
        self.log.refused += reply.get("refused", [])
        self.log.denied += reply.get("denied", [])
        self.denied += reply.get("denied", [])
        if "error" in reply:
            return self._raise(text, *reply["error"], reply.get("timed_out", False))
        value = reply["value"]
        if isinstance(value, dict) and value.get("$") == "method":
            return value
        answer = decode(value)
        made = isinstance(value, dict) and value.get("$") == "handle"
        self.log.calls.append(
            f"{text} made an object" if made else f"{text} returned {describe(answer)}"
        )
        if reply.get("refused"):
            raise StudentError(f"refused import: {', '.join(reply['refused'])}")
        return answer

    def _raise(self, text: str, kind: str, message: str, timed_out: bool) -> None:
        self.log.timed_out |= timed_out
        self.log.output_limit |= kind == "OutputLimit"
        self.log.calls.append(f"{text} raised {kind}: {message}")
        exc_type = getattr(builtins, kind, None)
        if kind in ("NotImplementedError", "MemoryError") and isinstance(exc_type, type):
            raise exc_type(message)  # the stub's signal, and the allocator's out-of-blocks answer
        raise StudentError(f"{kind}: {message}")


def _args_text(args: tuple) -> str:
    return ", ".join(describe(a) for a in args)


class RemoteFunction:
    """A student's function in the worker, called with plain data."""

    def __init__(self, worker: Worker, name: str) -> None:
        self.worker, self.name = worker, name

    def __call__(self, *args: object) -> object:
        request = {
            "op": "call",
            "target": self.name,
            "method": None,
            "args": [encode(a) for a in args],
        }
        return self.worker.call(request, f"{self.name}({_args_text(args)})")


class RemoteClass(RemoteFunction):
    """A student's class in the worker: calling it makes an instance there, reached by a handle."""

    def __call__(self, *args: object) -> _RemoteObject:
        handle = super().__call__(*args)
        return _RemoteObject(self.worker, handle, f"{self.name}({_args_text(args)})")


class _RemoteObject:
    """An instance of a student's class living in the worker; attributes and methods are
    forwarded."""

    def __init__(self, worker: Worker, handle: object, label: str) -> None:
        self._worker, self._id, self._label = worker, getattr(handle, "id", None), label
        self._generation = worker.generation
        if self._id is None:
            raise StudentError(f"{label} did not make an object")

    def _check_alive(self, text: str) -> None:
        if self._generation != self._worker.generation:
            raise StudentError(f"{text}: the object was lost when its worker was restarted")

    def __getattr__(self, name: str) -> object:
        if name.startswith("_"):
            raise AttributeError(name)
        self._check_alive(name)
        request = {"op": "getattr", "target": self._id, "name": name}
        value = self._worker.call(request, f".{name}")
        if isinstance(value, dict) and value.get("$") == "method":
            return lambda *args: self._method(name, args)
        return value

    def _method(self, name: str, args: tuple) -> object:
        self._check_alive(name)
        request = {
            "op": "call",
            "target": self._id,
            "method": name,
            "args": [encode(a) for a in args],
        }
        return self._worker.call(request, f"{name}({_args_text(args)})")
