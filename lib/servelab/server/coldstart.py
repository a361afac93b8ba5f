"""Cold start of a serving process, measured in a fresh Python interpreter.

System boundary: one new process that serves the course's tiny Llama with :class:`LLMEngine` on
this machine's CPU. :func:`measure_cold_start` runs this file in a new interpreter (nothing of
torch or servelab imported yet) and times, with both the wall clock and the CPU time of that
process, the phases a new replica goes through before it answers at full speed:

1. ``import`` -- importing torch and the engine;
2. ``weight load`` -- :func:`servelab.model.load_checkpoint`: reading ``model.safetensors``,
   checking the tensors against the config and building the model;
3. ``engine set-up`` -- the tokenizer, the paged KV pool and the scheduler;
4. ``first forward`` -- one warm-up forward pass over the prompt (lazy initialisation of the math
   kernels happens here; a GPU server also captures graphs and tunes kernels at this point);
5. ``first request`` -- the first real request's time to first token (TTFT);

and then the TTFT of ``n_steady`` more identical requests, the steady state. TTFT here is the
duration of a one-token ``LLMEngine.generate`` call: tokenization, scheduling, one prefill forward
pass and sampling, at the engine API (no HTTP). Two comparisons are timed outside the sequence: a
second forward pass like the warm-up one, and reading ``model.safetensors`` again on its own (the
file may already sit in the operating system's page cache, then and now). Every phase also counts
the Python modules imported during it: imports that a library defers to first use show up there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from servelab._validate import require_int, require_real

__all__ = ["PHASES", "ColdStart", "Phase", "measure_cold_start"]

PHASES = ("import", "weight load", "engine set-up", "first forward", "first request")
PROMPT = "KING LEAR:\nBlow, winds"


@dataclass(frozen=True)
class Phase:
    """One timed phase: wall-clock and CPU seconds of the serving process, modules it imported."""

    name: str
    wall_s: float
    cpu_s: float
    new_modules: int


@dataclass(frozen=True)
class ColdStart:
    """The phases of one cold start (in ``PHASES`` order), the two comparisons (a warm forward pass,
    a bare read of the weights file) and the steady TTFTs.

    ``torch_preloaded`` says whether torch was already imported when the measurement began (False
    in a fresh interpreter, which is what makes the ``import`` phase a measurement).
    """

    phases: tuple[Phase, ...]
    warm_forward: Phase
    file_read: Phase
    steady_ttft: tuple[Phase, ...]
    torch_preloaded: bool

    def phase(self, name: str) -> Phase:
        """The phase called ``name`` (one of ``PHASES``)."""
        if name not in PHASES:
            raise ValueError(f"name must be one of {PHASES}, got {name!r}")
        return next(p for p in self.phases if p.name == name)


class _Stopwatch:
    """Wall time, CPU time and the number of imported modules since the previous lap."""

    def __init__(self) -> None:
        self._mark = (time.perf_counter(), time.process_time(), len(sys.modules))

    def lap(self, name: str) -> dict:
        now = (time.perf_counter(), time.process_time(), len(sys.modules))
        phase = {"name": name, "wall_s": now[0] - self._mark[0], "cpu_s": now[1] - self._mark[1],
                 "new_modules": now[2] - self._mark[2]}
        self._mark = (time.perf_counter(), time.process_time(), len(sys.modules))
        return phase


def _time_requests(engine: object, params: object, count: int, watch: _Stopwatch) -> list[dict]:
    """``count`` identical one-token requests, one lap each: the first is the "first request"."""
    laps = []
    for i in range(count):
        engine.generate([PROMPT], params)
        laps.append(watch.lap("first request" if i == 0 else f"request {i + 1}"))
    return laps


def _child(n_steady: int, num_threads: int) -> dict:
    """The measurement itself; runs inside the fresh interpreter and returns plain data."""
    preloaded = "torch" in sys.modules
    watch = _Stopwatch()
    import torch
    from safetensors.torch import load_file

    from servelab.engine import EngineConfig, LLMEngine
    from servelab.model import default_model_dir, load_checkpoint, load_tokenizer
    from servelab.model.checkpoint import WEIGHTS_FILE
    from servelab.sampling import SamplingParams
    torch.set_num_threads(num_threads)
    phases = [watch.lap("import")]
    model = load_checkpoint(device="cpu", dtype=torch.float32)
    phases.append(watch.lap("weight load"))
    tokenizer = load_tokenizer()
    engine = LLMEngine(model, tokenizer, EngineConfig(device="cpu", dtype="float32"))
    ids = torch.tensor([tokenizer.encode(PROMPT).ids])
    phases.append(watch.lap("engine set-up"))
    with torch.no_grad():
        model(ids)
        phases.append(watch.lap("first forward"))
        model(ids)
        warm = watch.lap("warm forward")
    requests = _time_requests(
        engine, SamplingParams(temperature=0.0, max_tokens=1), 1 + n_steady, watch
    )
    load_file(str(Path(default_model_dir()) / WEIGHTS_FILE))
    return {
        "phases": phases + requests[:1],
        "warm_forward": warm,
        "file_read": watch.lap("file read"),
        "steady_ttft": requests[1:],
        "torch_preloaded": preloaded,
    }


def measure_cold_start(
    n_steady: int = 10, num_threads: int = 1, timeout_s: float = 300.0
) -> ColdStart:
    """Time a cold start in a new interpreter (``n_steady`` >= 1 steady requests, torch limited to
    ``num_threads`` threads) and return its phases; raise RuntimeError if the child fails."""
    require_int("n_steady", n_steady, 1)
    require_int("num_threads", num_threads, 1)
    require_real("timeout_s", timeout_s, 0.0, strict_min=True)
    package_root = str(Path(__file__).resolve().parents[2])  # the servelab this process imported
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p))
    # This file runs as a script: ``-m servelab.server.coldstart`` would import the servelab.server
    # package first, and with it the engine and torch, before the clock starts.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _RUN_AS_SCRIPT,
            str(Path(__file__).resolve()),
            str(n_steady),
            str(num_threads),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"cold-start child failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
        )
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return ColdStart(tuple(Phase(**p) for p in data["phases"]), Phase(**data["warm_forward"]),
                     Phase(**data["file_read"]), tuple(Phase(**p) for p in data["steady_ttft"]),
                     data["torch_preloaded"])


_RUN_AS_SCRIPT = (
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def main(argv: list[str]) -> int:
    """``python lib/servelab/server/coldstart.py N_STEADY NUM_THREADS``: print the measurement as
    one JSON line."""
    n_steady, num_threads = (int(a) for a in argv)
    print(json.dumps(_child(n_steady, num_threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
