"""The grading worker: runs one student's definitions and answers calls on them, as plain data.

This file is self-contained on purpose (standard library, plus NumPy and torch when a value needs
them): the grader runs its *text* with ``python -I -u -c`` in a fresh empty folder, so the worker never
imports ``servelab`` and nothing of the course library, the checkers or the grade sheet is reachable
from the student's code. The grader imports the same file as a module only for the wire format
(:func:`encode`, :func:`decode`).

Protocol: one JSON object per line on the file descriptors given as ``argv[1]`` (requests in) and
``argv[2]`` (replies out), then the output and memory limits in bytes; stdout and stderr belong to the student. Requests:

* ``{"op": "load", "statements": [source, ...], "allowed": {module: [names]}}`` -- run the notebook's
  extracted statements; reply ``{"kinds": {name: "class" | "function" | "value"}, "errors": [...],
  "refused": [...]}``;
* ``{"op": "call", "target": name | handle, "method": name | null, "args": [...], "limit": s}`` --
  call a defined function, a class (gives a handle) or a handle's method;
* ``{"op": "getattr", "target": handle, "name": attribute, "limit": s}``.

A call replies ``{"value": ...}`` or ``{"error": [type, message]}``, with ``"refused"`` (the servelab
imports refused during the call) and ``"timed_out"``. Per call, ``limit`` seconds of wall clock
(``SIGALRM``) and of CPU (``RLIMIT_CPU``'s ``SIGXCPU``) apply; the grader kills a worker that
still does not answer; output goes to a file
of capped size (``RLIMIT_FSIZE``) that is emptied before each call; ``RLIMIT_AS`` caps the worker's memory.
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
"""The top-level packages graded code may not import: the course library and its reference solutions."""


class _TimedOut(BaseException):
    """The call used up its time limit (raised from the alarm or the CPU-limit signal)."""


class RefusedImport(ImportError):
    """Graded code imported a ``servelab`` (or ``servelab_instructor``) module or name its exercise does
    not allow."""


@dataclass(frozen=True)
class RequestTiming:
    """A stand-in for ``servelab.metrics.latency.RequestTiming``: the same fields and properties, seconds."""

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
        return {"$": "dict", "items": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    kind = type(value).__module__.split(".")[0], type(value).__name__
    if kind == ("numpy", "ndarray"):
        return {"$": "ndarray", "dtype": str(value.dtype), "shape": list(value.shape), "data": value.ravel().tolist()}
    if kind[0] == "numpy" and hasattr(value, "item"):
        return value.item()
    if kind == ("torch", "Tensor"):
        flat = value.detach().cpu().reshape(-1)
        return {"$": "tensor", "dtype": str(flat.dtype).removeprefix("torch."), "shape": list(value.shape),
                "data": flat.tolist()}
    if kind[1] == "RequestTiming":
        return {"$": "timing", **{f: encode(getattr(value, f), depth + 1) for f in _TIMING_FIELDS}}
    raise TypeError(f"a {type(value).__name__} is not plain data (numbers, strings, lists, tuples, dicts, "
                    "NumPy arrays, torch tensors)")


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
        return torch.tensor(data["data"], dtype=getattr(torch, data["dtype"])).reshape(data["shape"])
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
            raise RefusedImport(f"import of {fullname} refused: graded code may not use the course library")
        return None

    def importer(self, original: object) -> object:
        """A wrapper of ``__import__`` that names the whole module an ``import`` statement asked for."""
        def guarded(name: str, globals: object = None, locals: object = None, fromlist: object = (),
                    level: int = 0) -> object:
            if level == 0 and name.split(".")[0] in _GUARDED:
                wanted = [name] if name not in self.allowed else \
                    [f"{name}.{n}" for n in fromlist or () if n not in self.allowed[name]]
                if wanted:
                    self.refused += wanted
                    raise RefusedImport(f"import of {', '.join(wanted)} refused: graded code may not use "
                                        "the course library")
            return original(name, globals, locals, fromlist, level)
        return guarded


def _install_guard(allowed: dict[str, list[str]]) -> _Guard:
    """Put the guard first on ``sys.meta_path`` and the allowed stand-in modules in ``sys.modules``.

    A stand-in module holds only its allowed names; asking it for any other name is a refused import.
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
    sys.path[:] = [p for p in sys.path if not any(os.path.isdir(os.path.join(p or ".", g)) for g in _GUARDED)]
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__name__.lower()]
    sys.meta_path.insert(0, guard)
    builtins.__import__ = guard.importer(builtins.__import__)
    return guard


def _refuser(guard: _Guard, module: str) -> object:
    def refuse(name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        guard.refused.append(f"{module}.{name}")
        raise RefusedImport(f"import of {module}.{name} refused: graded code may not use the course library")
    return refuse


def _on_limit(signum: int, frame: object) -> None:
    raise _TimedOut


class _Session:
    """The student's namespace, the objects it created and the per-call limits."""

    def __init__(self, output_limit: int) -> None:
        self.namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
        self.objects: dict[int, object] = {}
        self.guard = _Guard({})
        resource.setrlimit(resource.RLIMIT_FSIZE, (output_limit, output_limit))

    def load(self, request: dict) -> dict:
        self.guard = _install_guard(request["allowed"])
        errors = []
        for index, source in enumerate(request["statements"]):
            try:
                self._limited(request["limit"], exec, compile(source, f"<cell statement {index}>", "exec"),
                              self.namespace)
            except _TimedOut:
                errors.append(f"statement {index} timed out")
            except Exception as exc:  # a statement that raises does not stop the others
                errors.append(f"statement {index} raised {type(exc).__name__}: {exc}")
        kinds = {name: "class" if isinstance(v, type) else "function" if callable(v) else "value"
                 for name, v in self.namespace.items() if not name.startswith("__")}
        return {"kinds": kinds, "errors": errors, "refused": self._take_refused()}

    def _take_refused(self) -> list[str]:
        refused, self.guard.refused = list(dict.fromkeys(self.guard.refused)), []
        return refused

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
            resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    def _target(self, request: dict) -> object:
        target = request["target"]
        if isinstance(target, int):
            obj = self.objects[target]
            return getattr(obj, request["method"]) if request.get("method") else obj
        return self.namespace[target]

    def call(self, request: dict) -> dict:
        try:
            if request["op"] == "getattr":
                value = self._limited(request["limit"], getattr, self._target(request), request["name"])
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
            return self._reply({"error": ["TimeoutError", "the call ran past its time limit"], "timed_out": True})
        except OSError as exc:
            if exc.errno == 27:  # EFBIG: the output file reached RLIMIT_FSIZE
                return self._reply({"error": ["OutputLimit", "the code printed more than the output limit"]})
            return self._reply({"error": [type(exc).__name__, str(exc)]})
        except Exception as exc:
            return self._reply({"error": [type(exc).__name__, str(exc)]})

    def _reply(self, reply: dict) -> dict:
        return {**reply, "refused": self._take_refused()}


def _cap_memory(limit: int) -> None:
    """Cap the worker's address space (bytes). macOS refuses ``RLIMIT_AS`` below its current value,
    so there the cap is skipped; the wall-clock and CPU limits still hold."""
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError):
        if sys.platform.startswith("linux"):
            raise


def _serve(requests_fd: int, replies_fd: int, output_limit: int, memory_limit: int) -> None:
    _cap_memory(memory_limit)
    signal.signal(signal.SIGALRM, _on_limit)
    signal.signal(signal.SIGXCPU, _on_limit)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    session = _Session(output_limit)
    with os.fdopen(requests_fd, "r", encoding="utf-8") as requests, \
            os.fdopen(replies_fd, "w", encoding="utf-8") as replies:
        for line in requests:
            request = json.loads(line)
            try:
                reply = session.load(request) if request["op"] == "load" else session.call(request)
            except _TimedOut:
                reply = {"error": ["TimeoutError", "the call ran past its time limit"], "timed_out": True,
                         "refused": []}
            replies.write(json.dumps(reply) + "\n")
            replies.flush()


if __name__ == "__main__":
    _serve(*(int(a) for a in sys.argv[1:5]))
