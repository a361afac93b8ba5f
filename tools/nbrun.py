"""Run a notebook (or any command) in a process of its own, under a hard wall-clock deadline.

nbclient's cell timeout is kept by the same event loop that waits for the kernel's replies, so a
client that stops waking up never times out; a runner killed from inside its own process cannot be
sure to stop either. Here the deadline is kept by the *parent*: the notebook runs in a child
process (``python tools/nbrun.py --worker ...``) in a session of its own, the child records the
cell it is executing in a small progress file, and when the deadline passes the parent kills every
process under the child (the Jupyter kernel runs in a session of its own too) and reports the
notebook, the cell index and the first line of that cell's source.

Used by every runner of the course's notebooks: ``tools/execute_notebooks.py``,
``tools/clean_install.py``, the book build (``book/_ext/servelab_book.py``) and, through
:func:`run_command`, nbval one notebook at a time (``tools/run_nbval.py``).

Linux: the process tree is read from ``/proc``; elsewhere only the child's own session is killed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CommandRun", "NotebookRun", "kill_tree", "run_command", "run_notebook", "slowest_first",
           "CHECK_TAG", "is_checked"]

# --------------------------------------------------------------------------------------------------
# A process tree under a deadline
# --------------------------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    """Every live process's children, read from ``/proc`` (empty where there is no ``/proc``)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state letter
        tree.setdefault(parent, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, parents first."""
    tree, found, stack = _children(), [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(tree.get(current, []))
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, everything below it, and every process group those belong to.

    The groups matter: a Jupyter kernel starts in a session of its own, and what the kernel started
    (a server a notebook launched, say) may already have been re-parented away from it.
    """
    procs = descendants(pid)
    groups = set()
    for proc in procs:
        try:
            groups.add(os.getpgid(proc))
        except ProcessLookupError:
            pass
    groups.discard(os.getpgid(0))  # never our own group
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        try:
            os.kill(proc, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@dataclass(frozen=True)
class CommandRun:
    """What a command did under its deadline: exit status (None if it was killed), output, time (s)."""

    returncode: int | None
    output: str
    seconds: float
    timed_out: bool


def run_command(cmd: list[str], *, limit_s: float, cwd: Path | str | None = None,
                env: dict[str, str] | None = None) -> CommandRun:
    """Run ``cmd`` in a session of its own, stdout and stderr together; kill its whole tree at
    ``limit_s`` wall-clock seconds. The output is read through a file, so a chatty child never
    blocks on a full pipe."""
    start = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as sink:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc.pid)  # the tree is read while the child still holds it together
            proc.wait()
        sink.seek(0)
        output = sink.read()
    return CommandRun(None if timed_out else proc.returncode, output, time.monotonic() - start, timed_out)


# --------------------------------------------------------------------------------------------------
# A notebook under a deadline
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NotebookRun:
    """One notebook's run. ``notebook`` is the executed notebook (None if the run did not finish);
    ``cell`` and ``cell_line`` name the cell running when the deadline passed or the run failed."""

    name: str
    seconds: float
    timed_out: bool
    error: str | None
    cell: int | None
    cell_line: str
    notebook: object | None

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.error is None

    def where(self) -> str:
        """``NAME cell K (`first line`)``: the place a report points a reader to."""
        if self.cell is None:
            return self.name
        return f"{self.name} cell {self.cell} (`{self.cell_line}`)"


ANSI = re.compile(r"\x1b\[[0-9;]*m")
KERNEL_STARTUP_S = 180
"""How long to wait for a notebook's kernel to answer (seconds); nbclient's default of 60 s was too
short for the first kernel of a fresh clone on a loaded 2-core machine."""


def _first_line(source: str) -> str:
    lines = [line for line in source.splitlines() if line.strip()]
    return lines[0].strip()[:120] if lines else ""


def run_notebook(notebook: Path | object, *, limit_s: float, cwd: Path, name: str | None = None,
                 cell_timeout_s: float | None = None, allow_errors: bool = False,
                 python: str | None = None, env: dict[str, str] | None = None,
                 kernel_name: str = "python3") -> NotebookRun:
    """Execute a notebook (a path or an ``nbformat`` node) in a child process with a hard deadline.

    ``limit_s`` is the wall-clock limit for the whole notebook, kernel start included (seconds);
    ``cell_timeout_s`` is nbclient's own per-cell limit inside it (default: ``limit_s``). The kernel
    runs in ``cwd`` with ``python`` (default: this interpreter, which must have nbclient) and ``env``.
    With ``allow_errors`` every cell runs and errors stay in their outputs; otherwise the first error
    ends the run and is reported with its cell.
    """
    import nbformat

    nb = nbformat.read(notebook, as_version=4) if isinstance(notebook, (str, Path)) else notebook
    name = name or (Path(notebook).name if isinstance(notebook, (str, Path)) else "notebook")
    with tempfile.TemporaryDirectory(prefix="servelab-nbrun-") as tmp:
        work = Path(tmp)
        nbformat.write(nb, work / "in.ipynb")
        cmd = [python or sys.executable, str(Path(__file__).resolve()), "--worker", str(work), "--cwd", str(cwd),
               "--cell-timeout", str(cell_timeout_s or limit_s), "--kernel", kernel_name]
        if allow_errors:
            cmd.append("--allow-errors")
        done = run_command(cmd, limit_s=limit_s, cwd=cwd, env=env)
        progress = _read_json(work / "progress.json")
        result = _read_json(work / "result.json")
        executed = nbformat.read(work / "out.ipynb", as_version=4) if (work / "out.ipynb").exists() else None
    cell = progress.get("cell")
    line = progress.get("line", "")
    if done.timed_out:
        error = f"no result within the {limit_s:.0f} s limit"
    elif "error" in result:
        error = result["error"]
        cell, line = result.get("cell", cell), result.get("line", line)
    elif done.returncode != 0 or executed is None:
        tail = done.output.strip().splitlines()[-1:] or ["no output"]
        error = f"the runner exited with status {done.returncode}: {tail[0]}"
    else:
        error, cell, line = None, None, ""
    return NotebookRun(name, done.seconds, done.timed_out, error, cell, line, executed)


CHECK_TAG = "nbval-check-output"
"""The tag of a cell whose saved output a fresh run must reproduce (``tools/sync_notebooks.py`` turns a
``# NBVAL_CHECK_OUTPUT`` first line into it)."""


def is_checked(cell) -> bool:
    """Whether a fresh run of this notebook cell must reproduce its saved output."""
    return cell.get("cell_type") == "code" and CHECK_TAG in cell.get("metadata", {}).get("tags", [])


REAL_MODEL = "smollm2"


def slowest_first(notebooks: list[Path]) -> list[Path]:
    """``notebooks`` in the order to start them when a few run at a time, so the runners end together:
    those that load the real model first, then by file size (a guess at how long each one runs)."""
    def expected_cost(path: Path) -> tuple[bool, int]:
        text = path.read_text(encoding="utf-8")
        return REAL_MODEL in text.lower(), len(text)
    return sorted(notebooks, key=expected_cost, reverse=True)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: dict) -> None:
    """Write atomically, so the parent never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


POLL_SLICE_S = 0.5
"""How long one wait on a kernel channel may sleep before the socket is looked at again (seconds)."""


def sliced(get_msg_once):
    """A channel's ``get_msg`` that never sleeps longer than :data:`POLL_SLICE_S` at a time.

    The cause of the course's notebook-runner hangs: nbclient waits for a cell's ``execute_reply`` by
    polling the shell socket through pyzmq's asyncio wrapper, whose wake-up is edge-triggered. After
    a widget cell (dozens of ``comm_open`` messages on IOPub, processed while the reply arrives) the
    wake-up is sometimes lost: the reply sits in the socket (``zmq.EVENTS`` says POLLIN, one poll
    waiting on it) and nbclient sleeps until its per-cell timeout fires, then reads the reply as if
    nothing had happened. With the 300 s cell timeout, every widget cell could lose five minutes.
    A fresh poll looks at the socket's events first, so waiting in short slices turns a lost wake-up
    into at most one slice of delay. The total timeout is kept: ``Empty`` is raised once it is over.
    """
    from queue import Empty

    async def get_msg(timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return await get_msg_once(timeout=POLL_SLICE_S if left is None else min(POLL_SLICE_S, left))
            except Empty:
                if left is not None and time.monotonic() >= deadline:
                    raise

    return get_msg


def notebook_client_class():
    """nbclient's ``NotebookClient`` whose shell and IOPub waits use :func:`sliced` polling."""
    from nbclient import NotebookClient

    class SlicedPollClient(NotebookClient):
        async def async_start_new_kernel_client(self):
            client = await super().async_start_new_kernel_client()
            for channel in (client.shell_channel, client.iopub_channel):
                channel.get_msg = sliced(channel.get_msg)
            return client

    return SlicedPollClient


def _worker(work: Path, cwd: Path, cell_timeout_s: float, allow_errors: bool, kernel_name: str) -> int:
    """Inside the child: execute ``work/in.ipynb``, recording each cell as it starts."""
    import nbformat
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(work / "in.ipynb", as_version=4)

    def started(cell, cell_index: int, **_: object) -> None:
        _write_json(work / "progress.json", {"cell": cell_index, "line": _first_line(cell.source)})

    client = notebook_client_class()(nb, timeout=int(cell_timeout_s), kernel_name=kernel_name,
                                     allow_errors=allow_errors, on_cell_execute=started,
                                     startup_timeout=KERNEL_STARTUP_S,
                                     resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute()
    except CellExecutionError as exc:
        progress = _read_json(work / "progress.json")
        last = ANSI.sub("", str(exc)).strip().splitlines()[-1:] or [type(exc).__name__]
        _write_json(work / "result.json", {"error": last[0], **progress})
        return 1
    except Exception as exc:  # a timeout, a dead kernel: reported with the cell it happened in
        progress = _read_json(work / "progress.json")
        _write_json(work / "result.json", {"error": f"{type(exc).__name__}: {exc}"[:500], **progress})
        return 1
    nbformat.write(nb, work / "out.ipynb")
    _write_json(work / "result.json", {"ok": True})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Execute one notebook (the child side of run_notebook).")
    parser.add_argument("--worker", type=Path, required=True, help="folder holding in.ipynb")
    parser.add_argument("--cwd", type=Path, required=True, help="the kernel's working folder")
    parser.add_argument("--cell-timeout", type=float, required=True, help="nbclient's per-cell limit (s)")
    parser.add_argument("--kernel", default="python3")
    parser.add_argument("--allow-errors", action="store_true")
    args = parser.parse_args(argv)
    return _worker(args.worker, args.cwd, args.cell_timeout, args.allow_errors, args.kernel)


if __name__ == "__main__":
    sys.exit(main())
