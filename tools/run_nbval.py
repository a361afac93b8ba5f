"""nbval on the course notebooks, one notebook per process, each under a hard wall-clock limit.

One pytest run over every notebook would share one fate: a notebook that hangs would hold the whole
run past CI's limit. Here each notebook gets its own ``pytest --nbval-lax`` process (in a session of
its own, see :func:`nbrun.run_command`), killed with its kernel at ``--limit`` seconds and
reported with the cell it was running (nbval's verbose output names each cell as it starts). A hung
notebook is retried once; a retry that passes still prints a warning naming the cell.

Usage::

    python tools/run_nbval.py notebooks/*.ipynb notebooks/exercises/*.ipynb
    python tools/run_nbval.py --jobs 2 --limit 300 notebooks/ch03-sampling.ipynb
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import nbformat

from nbrun import CommandRun, run_command, slowest_first
from servelab.prose import count

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_LIMIT_S = 600
"""The hard limit for one notebook's nbval run (seconds). The slowest, §7, takes about 2.5 minutes on
a quiet 2-core machine and took 400 s beside another notebook with the cores already busy."""
CELL_TIMEOUT_S = 300
KERNEL_STARTUP_S = 180
"""How long nbval waits for a kernel to answer (seconds). nbval's default, 60 s, was too short for the
first kernel of a fresh clone on a loaded 2-core CI machine (its bytecode and caches still cold)."""
KERNEL_NOT_STARTED = "Kernel didn't respond"
SANITIZE = ROOT / "notebooks" / "sanitize.cfg"
NBVAL = ["-m", "pytest", "-v", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env",
         "--nbval-sanitize-with", str(SANITIZE), f"--nbval-cell-timeout={CELL_TIMEOUT_S}",
         f"--nbval-kernel-startup-timeout={KERNEL_STARTUP_S}"]
CELL_STARTED = re.compile(r"::Cell (\d+)")
SUMMARY = re.compile(r"=+ (.*(?:passed|failed|error).*) in [\d.]+s")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
FAILED_CELL = re.compile(r"^_{3,} .+?::Cell (\d+) _{3,}$", re.M)
REASON = re.compile(r"^Cell \d+: (.+)$", re.M)
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)(?:: .*)?$")
CAUSE = "CAUSE "
"""The prefix of the one line per failed notebook that ``tools/stage.sh`` repeats at the end of
``make test``: the notebook, the cell and the exception's last line."""


@dataclass(frozen=True)
class NbvalRun:
    """One notebook's nbval run; ``hung_at`` names the cell of a run that was killed (or '')."""

    notebook: Path
    run: CommandRun
    hung_at: str

    @property
    def ok(self) -> bool:
        return not self.run.timed_out and self.run.returncode == 0

    def summary(self) -> str:
        found = SUMMARY.findall(self.run.output)
        return found[-1] if found else "no summary"


def cell_label(notebook: Path, index: int) -> str:
    """``cell K (`first line`)`` for code cell ``index`` (nbval's numbering counts code cells)."""
    code = [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
    lines = [line.strip() for line in code[index].source.splitlines() if line.strip()] if index < len(code) else []
    return f"cell {index} (`{lines[0][:120] if lines else ''}`)"


def running_cell(notebook: Path, output: str) -> str:
    """:func:`cell_label` of the last cell nbval started."""
    started = CELL_STARTED.findall(output)
    return cell_label(notebook, int(started[-1])) if started else "before its first cell"


def failure_cause(notebook: Path, output: str) -> str:
    """Why nbval failed ``notebook``, in one line: its first failing cell and the exception's last
    line (or nbval's reason, such as outputs that differ from the committed ones)."""
    text = ANSI.sub("", output)
    failed = list(FAILED_CELL.finditer(text))
    if not failed:
        lines = [line for line in text.splitlines() if line.strip()]
        return f"{notebook}: {lines[-1].strip() if lines else 'no output'}"
    first = failed[0]
    end = failed[1].start() if len(failed) > 1 else len(text)
    body = text[first.end():end].split("\n=====")[0]
    exceptions = [line.strip() for line in body.splitlines() if EXCEPTION.match(line.strip())]
    reason = REASON.search(body)
    last = exceptions[-1] if exceptions else (reason.group(1) if reason else "failed")
    return f"{notebook} {cell_label(notebook, int(first.group(1)))}: {last[:300]}"


@dataclass(frozen=True)
class Interpreter:
    """Where nbval runs: the Python whose pytest, nbval and kernel are used, and the folder pytest
    starts in (the checkout, or the clean install's folder outside it)."""

    python: str = sys.executable
    cwd: Path = ROOT


def nbval_once(notebook: Path, env: dict[str, str] | None, limit_s: float,
               where: Interpreter = Interpreter()) -> NbvalRun:
    run = run_command([where.python, *NBVAL, str(notebook)], limit_s=limit_s, cwd=where.cwd, env=env)
    return NbvalRun(notebook, run, running_cell(notebook, run.output) if run.timed_out else "")


def nbval_notebook(notebook: Path, env: dict[str, str] | None = None, limit_s: float = NOTEBOOK_LIMIT_S,
                   log=print, where: Interpreter = Interpreter()) -> tuple[NbvalRun, str]:
    """nbval on one notebook, retried once if it hangs or its kernel never starts; returns the run and
    a warning ('' if none)."""
    first = nbval_once(notebook, env, limit_s, where)
    if KERNEL_NOT_STARTED in first.run.output and not first.ok:
        log(f"KERNEL {notebook}: the kernel did not start within {KERNEL_STARTUP_S} s; retrying once")
        second = nbval_once(notebook, env, limit_s, where)
        return second, f"{notebook}: its kernel did not start the first time; the retry {'passed' if second.ok else 'failed'}"
    if not first.run.timed_out:
        return first, ""
    log(f"HANG {notebook}: killed after {first.run.seconds:.0f} s at {first.hung_at}; retrying once")
    second = nbval_once(notebook, env, limit_s, where)
    if second.run.timed_out:
        return second, f"{notebook} hung twice: at {first.hung_at}, then at {second.hung_at}"
    return second, f"{notebook} hung once at {first.hung_at}; its retry {'passed' if second.ok else 'failed'}"


def run_nbval(notebooks: list[Path], env: dict[str, str] | None = None, jobs: int = 2,
              limit_s: float = NOTEBOOK_LIMIT_S, label: str = "", where: Interpreter = Interpreter()) -> bool:
    """nbval on every notebook, ``jobs`` at a time (slowest first, so the two workers end together);
    prints one line per notebook as it ends; True if all passed."""
    prefix = f"[{label}] " if label else ""

    def log(message: str) -> None:
        print(prefix + message, flush=True)

    failed, warnings, causes = 0, [], []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(nbval_notebook, nb, env, limit_s, log, where)
                   for nb in slowest_first(notebooks)]
        for future in as_completed(futures):  # each line as its notebook ends
            run, warning = future.result()
            status = "ok" if run.ok else ("HUNG" if run.run.timed_out else "FAIL")
            log(f"{status:4} {run.notebook}  {run.run.seconds:5.1f} s  {run.summary()}")
            if not run.ok and not run.run.timed_out:
                print(run.run.output[-6000:], flush=True)
                causes.append(failure_cause(run.notebook, run.run.output))
            elif run.run.timed_out:
                causes.append(f"{run.notebook}: {warning}")
            if warning:
                warnings.append(warning)
            failed += not run.ok
    for warning in warnings:
        print(f"{prefix}WARNING (retried): {warning}")
    for cause in causes:
        print(f"{CAUSE}{prefix}{cause}")
    print(f"{prefix}nbval: {len(notebooks) - failed} of {count(len(notebooks), 'notebook')} passed"
          f"{f', {len(warnings)} retried' if warnings else ''}")
    return failed == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--limit", type=float, default=NOTEBOOK_LIMIT_S, help="seconds per notebook")
    args = parser.parse_args(argv)
    return 0 if run_nbval(args.notebooks, jobs=args.jobs, limit_s=args.limit) else 1


if __name__ == "__main__":
    sys.exit(main())
