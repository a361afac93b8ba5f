"""The grading worker: runs one student's definitions and answers calls on them, as plain data.

This file is self-contained on purpose (standard library, plus NumPy and torch when a value needs
them): the grader runs its *text* with ``python -I -u -c`` in a fresh empty folder, so the worker
never imports ``servelab`` and nothing of the course library, the checkers or the grade sheet is
reachable from the student's code. The grader imports the same file as a module only for the wire
format (:func:`encode`, :func:`decode`).

Protocol: one JSON object per line on the file descriptors given as ``argv[1]`` (requests in) and
``argv[2]`` (replies out), then the output and memory limits in bytes, the uid to drop to (-1:
keep), the process limit (0: none) and the scratch folder; stdout and stderr belong to the student.
Requests:

* ``{"op": "load", "statements": [source, ...], "allowed": {module: [names]}}`` -- run the
  notebook's extracted statements; reply ``{"kinds": {name: "class" | "function" | "value"},
  "errors": [...], "refused": [...]}``;
* ``{"op": "call", "target": name | handle, "method": name | null, "args": [...], "limit": s}`` --
  call a defined function, a class (gives a handle) or a handle's method;
* ``{"op": "getattr", "target": handle, "name": attribute, "limit": s}``.

A call replies ``{"value": ...}`` or ``{"error": [type, message]}``, with ``"refused"`` (the
servelab imports refused during the call) and ``"timed_out"``. Per call, ``limit`` seconds of wall
clock (``SIGALRM``) and of CPU (``RLIMIT_CPU``'s ``SIGXCPU``) apply; the grader kills a worker that
still does not answer; output goes to a file of capped size (``RLIMIT_FSIZE``) that is emptied
before each call; ``RLIMIT_AS`` caps the worker's memory, ``RLIMIT_NPROC`` its processes.

While student code runs, an audit hook (:class:`_Sentry`) refuses what a definition or a call has no
business doing -- starting a process, signalling another process, opening a socket, writing or
deleting outside the scratch folder, opening a file descriptor it was not given, loading a C library
from outside the interpreter's folders -- and each reply names what was refused (``"denied"``); the
grader scores the exercise 0 for it. The hook is a reporter, not the wall: Python code can get
around an audit hook (through ``ctypes``), so the grader runs this worker inside an OS sandbox
(:mod:`servelab_instructor.grader.isolation`) that holds whatever the hook misses.
"""

from __future__ import annotations

import builtins
import importlib.abc
import json
import math
import os
import resource
import signal
import sys
import types
from dataclasses import dataclass

__all__ = ["RequestTiming", "decode", "encode"]

_LOOSE_TYPES = (bool, int, float, str, type(None))
_GUARDED = ("servelab", "servelab_instructor")
"""The top-level packages graded code may not import: the course library and its reference
solutions."""


class _TimedOut(BaseException):
    """The call used up its time limit (raised from the alarm or the CPU-limit signal)."""


class RefusedImport(ImportError):
    """Graded code imported a ``servelab`` (or ``servelab_instructor``) module or name its exercise
    does not allow."""


@dataclass(frozen=True)
class RequestTiming:
    """A stand-in for ``servelab.metrics.latency.RequestTiming``: the same fields and properties,
    seconds."""

    arrival: float
    first_scheduled: float
    emit_times: tuple[float, ...]
    finish: float
    prompt_tokens: int = 0

    @property
    def output_tokens(self) -> int:
        return len(self.emit_times)

    @property
    def queue_delay(self) -> float:
        return self.first_scheduled - self.arrival

    @property
    def ttft(self) -> float:
        return self.emit_times[0] - self.arrival

    @property
    def itl(self) -> list:
        return [b - a for a, b in zip(self.emit_times, self.emit_times[1:])]

    @property
    def tpot(self) -> float | None:
        if len(self.emit_times) < 2:
            return None
        return (self.emit_times[-1] - self.emit_times[0]) / (len(self.emit_times) - 1)

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival


_TIMING_FIELDS = ("arrival", "first_scheduled", "emit_times", "finish", "prompt_tokens")


def encode(value: object, depth: int = 0) -> object:
    """``value`` as JSON-ready plain data; TypeError for anything that is not data."""
    if depth > 40:
        raise TypeError("the value is nested more than 40 levels deep")
    if isinstance(value, _LOOSE_TYPES):
        return value
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"$": "tuple", "items": [encode(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {
            "$": "dict",
            "items": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()],
        }
    kind = type(value).__module__.split(".")[0], type(value).__name__
    if kind == ("numpy", "ndarray"):
        return {
            "$": "ndarray",
            "dtype": str(value.dtype),
            "shape": list(value.shape),
            "data": value.ravel().tolist(),
        }
    if kind[0] == "numpy" and hasattr(value, "item"):
        return value.item()
    if kind == ("torch", "Tensor"):
        flat = value.detach().cpu().reshape(-1)
        return {
            "$": "tensor",
            "dtype": str(flat.dtype).removeprefix("torch."),
            "shape": list(value.shape),
            "data": flat.tolist(),
        }
    if kind[1] == "RequestTiming":
        return {"$": "timing", **{f: encode(getattr(value, f), depth + 1) for f in _TIMING_FIELDS}}
    raise TypeError(
        f"a {type(value).__name__} is not plain data (numbers, strings, lists, tuples, dicts, "
        "NumPy arrays, torch tensors)"
    )


def decode(data: object, timing: type = RequestTiming) -> object:
    """The value :func:`encode` wrote; ``timing`` is the class a request record becomes."""
    if isinstance(data, list):
        return [decode(v, timing) for v in data]
    if not isinstance(data, dict):
        return data
    tag = data["$"]
    if tag == "tuple":
        return tuple(decode(v, timing) for v in data["items"])
    if tag == "dict":
        return {decode(k, timing): decode(v, timing) for k, v in data["items"]}
    if tag == "ndarray":
        import numpy as np
        return np.array(data["data"], dtype=data["dtype"]).reshape(data["shape"])
    if tag == "tensor":
        import torch

        return torch.tensor(data["data"], dtype=getattr(torch, data["dtype"])).reshape(
            data["shape"]
        )
    if tag == "timing":
        return timing(**{f: decode(data[f], timing) for f in _TIMING_FIELDS})
    if tag == "handle":
        return _Handle(data["id"])
    raise ValueError(f"unknown wire tag {tag!r}")


@dataclass(frozen=True)
class _Handle:
    """An object that lives in the worker (an instance of a student's class), by number."""

    id: int


class _Guard(importlib.abc.MetaPathFinder):
    """Refuses every ``servelab`` and ``servelab_instructor`` import except the allowed stand-ins;
    records each refusal."""

    def __init__(self, allowed: dict[str, list[str]]) -> None:
        self.allowed, self.refused = allowed, []

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname.split(".")[0] in _GUARDED and fullname not in sys.modules:
            self.refused.append(fullname)
            raise RefusedImport(
                f"import of {fullname} refused: graded code may not use the course library"
            )
        return None

    def importer(self, original: object) -> object:
        """A wrapper of ``__import__`` that names the whole module an ``import`` statement asked
        for."""
        def guarded(name: str, globals: object = None, locals: object = None, fromlist: object = (),
                    level: int = 0) -> object:
            if level == 0 and name.split(".")[0] in _GUARDED:
                wanted = [name] if name not in self.allowed else \
                    [f"{name}.{n}" for n in fromlist or () if n not in self.allowed[name]]
                if wanted:
                    self.refused += wanted
                    raise RefusedImport(
                        f"import of {', '.join(wanted)} refused: graded code may not use "
                        "the course library"
                    )
            return original(name, globals, locals, fromlist, level)
        return guarded


def _install_guard(allowed: dict[str, list[str]]) -> _Guard:
    """Put the guard first on ``sys.meta_path`` and the allowed stand-in modules in ``sys.modules``.

    A stand-in module holds only its allowed names; asking it for any other name is a refused
    import.
    """
    guard = _Guard(allowed)
    stand_ins = {"RequestTiming": RequestTiming}
    for module, names in allowed.items():
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in sys.modules:
                sys.modules[name] = types.ModuleType(name)
                sys.modules[name].__path__ = []  # a package: its other submodules reach the guard
                sys.modules[name].__getattr__ = _refuser(guard, name)
        for name in names:
            setattr(sys.modules[module], name, stand_ins[name])
    sys.path[:] = [
        p for p in sys.path if not any(os.path.isdir(os.path.join(p or ".", g)) for g in _GUARDED)
    ]
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__name__.lower()]
    sys.meta_path.insert(0, guard)
    builtins.__import__ = guard.importer(builtins.__import__)
    return guard


def _refuser(guard: _Guard, module: str) -> object:
    def refuse(name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        guard.refused.append(f"{module}.{name}")
        raise RefusedImport(
            f"import of {module}.{name} refused: graded code may not use the course library"
        )
    return refuse


class RefusedOperation(PermissionError):
    """Graded code tried something the sandbox refuses (a process, a signal, a socket, a file
    outside)."""


_PROCESS_EVENTS = ("os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
                   "subprocess.Popen", "pty.spawn")
_SIGNAL_EVENTS = ("os.kill", "os.killpg", "signal.pthread_kill")
_NETWORK_EVENTS = (
    "socket.__new__",
    "socket.connect",
    "socket.bind",
    "socket.sendto",
    "socket.getaddrinfo",
)
_PATH_EVENTS = (
    "os.remove",
    "os.rmdir",
    "os.rename",
    "os.truncate",
    "os.chmod",
    "os.chown",
    "os.mkdir",
    "os.link",
    "os.symlink",
    "os.utime",
    "shutil.rmtree",
    "shutil.move",
    "shutil.copyfile",
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class _Sentry:
    """The audit hook: once ``active`` (before the first statement runs, for the worker's whole
    life, so threads a submission starts are watched too), refuses and records what graded code may
    not do."""

    def __init__(self, scratch: str) -> None:
        self.scratch, self.denied, self.active = os.path.realpath(scratch), [], False
        self.libraries = tuple(
            {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, "/usr/lib")}
        )

    def __call__(self, event: str, args: tuple) -> None:
        if not self.active:
            return
        self.active = False  # the checks below must not audit themselves
        try:
            reason = self.reason(event, args)
        finally:
            self.active = True
        if reason:
            self.denied.append(reason)
            raise RefusedOperation(f"{reason} refused: graded code runs in a sandbox")

    def outside(self, path: object) -> bool:
        """True for a path outside the scratch folder (relative paths are inside)."""
        try:
            full = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return True
        return (
            full != self.scratch
            and not full.startswith(self.scratch + os.sep)
            and full != os.devnull
        )

    def reason(self, event: str, args: tuple) -> str | None:
        if event in _PROCESS_EVENTS:
            return f"starting a process ({event})"
        if event in _SIGNAL_EVENTS:
            return f"sending signal {args[-1]} to process {args[0]} ({event})"
        if event in _NETWORK_EVENTS:
            return f"network access ({event})"
        if event in _PATH_EVENTS and any(
            self.outside(a) for a in args[:2] if isinstance(a, (str, bytes))
        ):
            return f"changing {args[0]!s} outside the scratch folder ({event})"
        if event == "open":
            return self._open_reason(*args[:3])
        if event == "ctypes.dlopen" and not (
            isinstance(args[0], str)
            and os.path.isabs(args[0])
            and os.path.realpath(args[0]).startswith(self.libraries)
        ):
            return f"loading the C library {args[0]!r} (ctypes)"
        return None

    def _open_reason(self, path: object, mode: object, flags: object) -> str | None:
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
            (isinstance(flags, int) and flags & _WRITE_FLAGS)
        if isinstance(path, int):
            return None if path in (0, 1, 2) else f"opening file descriptor {path}"
        text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
        parts = text.split("/")
        if (
            text.startswith("/proc/")
            and len(parts) > 2
            and parts[2] not in ("self", "thread-self", str(os.getpid()))
            and parts[2].isdigit()
        ):
            return f"reading another process's {text}"
        if writing and self.outside(text):
            return f"writing {text} outside the scratch folder"
        return None


def _on_limit(signum: int, frame: object) -> None:
    raise _TimedOut


class _Session:
    """The student's namespace, the objects it created and the per-call limits."""

    def __init__(self, output_limit: int, sentry: _Sentry) -> None:
        self.namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
        self.objects: dict[int, object] = {}
        self.guard = _Guard({})
        self.sentry = sentry
        resource.setrlimit(resource.RLIMIT_FSIZE, (output_limit, output_limit))

    def load(self, request: dict) -> dict:
        self.guard = _install_guard(request["allowed"])
        errors = []
        for index, source in enumerate(request["statements"]):
            try:
                self._limited(
                    request["limit"],
                    exec,
                    compile(source, f"<cell statement {index}>", "exec"),
                    self.namespace,
                )
            except _TimedOut:
                errors.append(f"statement {index} timed out")
            except Exception as exc:  # a statement that raises does not stop the others
                errors.append(f"statement {index} raised {type(exc).__name__}: {exc}")
        kinds = {name: "class" if isinstance(v, type) else "function" if callable(v) else "value"
                 for name, v in self.namespace.items() if not name.startswith("__")}
        return {
            "kinds": kinds,
            "errors": errors,
            "refused": self._take_refused(),
            "denied": self._take_denied(),
        }

    def _take_refused(self) -> list[str]:
        refused, self.guard.refused = list(dict.fromkeys(self.guard.refused)), []
        return refused

    def _take_denied(self) -> list[str]:
        denied, self.sentry.denied = list(dict.fromkeys(self.sentry.denied)), []
        return denied

    def _limited(self, seconds: float, fn: object, *args: object) -> object:
        """Run ``fn(*args)`` under a wall-clock alarm and a CPU limit of ``seconds``."""
        os.ftruncate(1, 0)
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu = math.ceil(used.ru_utime + used.ru_stime + seconds)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, resource.RLIM_INFINITY))
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
        try:
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            resource.setrlimit(
                resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            )

    def _target(self, request: dict) -> object:
        target = request["target"]
        if isinstance(target, int):
            obj = self.objects[target]
            return getattr(obj, request["method"]) if request.get("method") else obj
        return self.namespace[target]

    def call(self, request: dict) -> dict:
        try:
            if request["op"] == "getattr":
                value = self._limited(
                    request["limit"], getattr, self._target(request), request["name"]
                )
                if callable(value):
                    return self._reply({"value": {"$": "method"}})
            else:
                args = [decode(a) for a in request["args"]]
                fn = self._target(request)
                value = self._limited(request["limit"], fn, *args)
                if isinstance(fn, type):
                    self.objects[len(self.objects)] = value
                    return self._reply({"value": {"$": "handle", "id": len(self.objects) - 1}})
            return self._reply({"value": encode(value)})
        except _TimedOut:
            return self._reply(
                {"error": ["TimeoutError", "the call ran past its time limit"], "timed_out": True}
            )
        except OSError as exc:
            if exc.errno == 27:  # EFBIG: the output file reached RLIMIT_FSIZE
                return self._reply(
                    {"error": ["OutputLimit", "the code printed more than the output limit"]}
                )
            return self._reply({"error": [type(exc).__name__, str(exc)]})
        except Exception as exc:
            return self._reply({"error": [type(exc).__name__, str(exc)]})

    def _reply(self, reply: dict) -> dict:
        return {**reply, "refused": self._take_refused(), "denied": self._take_denied()}


def _cap_memory(limit: int) -> None:
    """Cap the worker's address space (bytes). macOS refuses ``RLIMIT_AS`` below its current value,
    so there the cap is skipped; the wall-clock and CPU limits still hold."""
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError):
        if sys.platform.startswith("linux"):
            raise


def _drop_privileges(uid: int, process_limit: int) -> None:
    """Cap the processes (``RLIMIT_NPROC``) and, when ``uid >= 0``, become that uid and group with
    no supplementary groups (as root this also clears every capability)."""
    if process_limit > 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (process_limit, process_limit))
    if uid >= 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _serve(requests_fd: int, replies_fd: int, output_limit: int, memory_limit: int, uid: int = -1,
           process_limit: int = 0, scratch: str = ".") -> None:
    _drop_privileges(uid, process_limit)
    _cap_memory(memory_limit)
    signal.signal(signal.SIGALRM, _on_limit)
    signal.signal(signal.SIGXCPU, _on_limit)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # (loaded before the hook: NumPy imports it, and its import opens libpython)
    import ctypes  # noqa: F401
    sys.dont_write_bytecode = True  # an import writes nothing outside the scratch folder
    sentry = _Sentry(scratch)
    sys.addaudithook(sentry)
    session = _Session(output_limit, sentry)
    with os.fdopen(requests_fd, "r", encoding="utf-8") as requests, \
            os.fdopen(replies_fd, "w", encoding="utf-8") as replies:
        sentry.active = True
        for line in requests:
            request = json.loads(line)
            try:
                reply = session.load(request) if request["op"] == "load" else session.call(request)
            except _TimedOut:
                reply = {
                    "error": ["TimeoutError", "the call ran past its time limit"],
                    "timed_out": True,
                    "refused": [],
                    "denied": session._take_denied(),
                }
            replies.write(json.dumps({**reply, "id": request.get("id")}) + "\n")
            replies.flush()


if __name__ == "__main__":
    _serve(*(int(a) for a in sys.argv[1:7]), *sys.argv[7:8])
