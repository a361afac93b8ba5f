"""Notebook runners under a hard deadline (nbrun and the tools built on it).

Every runner of the course's notebooks must finish or fail with a named cell: a cell that never returns
is stopped by a limit kept outside its process, the kernel dies with it, and the report names the
notebook, the cell index and the first line of the cell.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from queue import Empty

import nbformat
import pytest

from runner_notebooks import never_returns, notebook, wait_dead

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import nbrun  # noqa: E402 (tools/nbrun.py)

LIMIT_S = 15  # a kernel starts in a few seconds even on a loaded 2-core machine


def test_a_cell_that_never_returns_is_stopped_with_its_kernel_and_named(tmp_path):
    pid_file = tmp_path / "kernel.pid"
    start = time.monotonic()
    run = nbrun.run_notebook(never_returns(pid_file), limit_s=LIMIT_S, cwd=tmp_path, name="never.ipynb",
                             cell_timeout_s=3600)
    elapsed = time.monotonic() - start
    assert run.timed_out and not run.ok and run.notebook is None
    assert elapsed < LIMIT_S + 10
    assert (run.cell, run.cell_line) == (1, "import time  # this cell never returns")
    assert run.where() == "never.ipynb cell 1 (`import time  # this cell never returns`)"
    assert wait_dead(int(pid_file.read_text())), "the kernel outlived the deadline"


def test_a_finished_notebook_comes_back_with_its_outputs_and_errors_name_their_cell(tmp_path):
    nb = notebook("x = 6 * 7", "print(x)", "1 / 0", "print('after')")
    run = nbrun.run_notebook(nb, limit_s=LIMIT_S * 2, cwd=tmp_path, allow_errors=True)
    assert run.ok and run.notebook.cells[1].outputs[0]["text"] == "42\n"
    assert run.notebook.cells[2].outputs[0]["ename"] == "ZeroDivisionError"
    assert run.notebook.cells[3].outputs[0]["text"] == "after\n"
    stop = nbrun.run_notebook(nb, limit_s=LIMIT_S * 2, cwd=tmp_path, name="err.ipynb")
    assert not stop.ok and not stop.timed_out and stop.notebook is None
    assert stop.cell == 2 and "ZeroDivisionError" in stop.error and "\x1b" not in stop.error


def test_run_command_kills_a_grandchild_that_left_the_session(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = ("import os, subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(600)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
              "time.sleep(600)\n")
    done = nbrun.run_command([sys.executable, "-c", script], limit_s=3, cwd=tmp_path)
    assert done.timed_out and done.returncode is None
    assert wait_dead(int(pid_file.read_text()))


def test_sliced_polling_waits_the_whole_timeout_in_short_slices_and_returns_a_late_message():
    calls = []

    async def get_msg_once(timeout=None):
        calls.append(timeout)
        if len(calls) < 4:
            raise Empty
        return {"msg": "late"}

    assert asyncio.run(nbrun.sliced(get_msg_once)(timeout=30)) == {"msg": "late"}
    assert len(calls) == 4 and max(calls) <= nbrun.POLL_SLICE_S

    async def never(timeout=None):
        await asyncio.sleep(timeout)
        raise Empty

    start = time.monotonic()
    with pytest.raises(Empty):
        asyncio.run(nbrun.sliced(never)(timeout=1.2))
    assert 1.1 < time.monotonic() - start < 3


def test_widget_cells_run_through_the_runner(tmp_path):
    """The cells that used to lose a reply's wake-up (live ipywidgets controls) finish well within the
    limit, while each cell may wait 10 minutes in nbclient's own timeout: a lost wake-up would show
    as a run killed at the limit."""
    cells = ["import numpy as np\nfrom servelab.viz import sampling as vs\nz = np.linspace(3, -3, 12)\n"
             "labels = [f't{i}' for i in range(12)]"]
    cells += [f"vs.sampling_controls(z, labels, show_top={5 + i})" for i in range(6)]
    run = nbrun.run_notebook(notebook(*cells), limit_s=240, cwd=tmp_path, cell_timeout_s=600)
    assert run.ok, run.error
    views = [o for c in run.notebook.cells[1:] for o in c.outputs
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(views) == 6


def test_execute_notebooks_reports_a_hang_with_its_cell(tmp_path):
    path = tmp_path / "never.ipynb"
    nbformat.write(never_returns(tmp_path / "pid"), path)
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "execute_notebooks.py"), "--limit",
                           str(LIMIT_S), str(path)], capture_output=True, text=True, timeout=LIMIT_S + 60)
    assert done.returncode == 1
    assert "hung at never.ipynb cell 1 (`import time  # this cell never returns`)" in done.stdout
    assert nbformat.read(path, as_version=4).cells[0].outputs == []  # left unchanged


def test_the_book_executor_turns_a_hang_into_a_named_timeout(tmp_path, monkeypatch):
    from servelab_book import NOTEBOOK_LIMIT_ENV, execute_with_deadline

    monkeypatch.setenv(NOTEBOOK_LIMIT_ENV, str(LIMIT_S))
    result = execute_with_deadline(never_returns(tmp_path / "pid"), str(tmp_path), 3600, False)
    assert type(result.err).__name__ == "CellTimeoutError"
    assert result.exc_string.startswith("hung at cell 1 (`import time  # this cell never returns`)")
    done = execute_with_deadline(notebook("print(6 * 7)"), str(tmp_path), 60, False)
    assert done.err is None and done.nb.cells[0].outputs[0]["text"] == "42\n"


def _tiny_book(root: Path, notebooks: dict[str, nbformat.NotebookNode]) -> Path:
    """A one-chapter-per-notebook book using the course's extension, executed on every build."""
    book = root / "book"
    (book / "book").mkdir(parents=True)
    (book / "book" / "_ext").symlink_to(ROOT / "book" / "_ext")
    (book / "intro.md").write_text("# Intro\n\nA page.\n")
    for name, nb in notebooks.items():
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(f"# {name}"))
        nbformat.write(nb, book / f"{name}.ipynb")
    chapters = "".join(f"  - file: {name}\n" for name in notebooks)
    (book / "_toc.yml").write_text(f"format: jb-book\nroot: intro\nchapters:\n{chapters}")
    (book / "_config.yml").write_text(
        "title: t\nexecute:\n  execute_notebooks: force\n  timeout: 3600\n"
        "repository:\n  url: https://github.com/servelab/servelab\n  branch: main\n"
        "sphinx:\n  local_extensions:\n    servelab_book: book/_ext\n  config:\n    nb_execution_show_tb: true\n")
    return book


def test_a_book_whose_notebook_hangs_fails_its_build_naming_the_notebook(tmp_path):
    """The real build: jupyter-book with the course's extension, one page and one hanging notebook."""
    book = _tiny_book(tmp_path, {"stuck": never_returns(tmp_path / "pid")})
    env = {**os.environ, "SERVELAB_NOTEBOOK_LIMIT_S": str(LIMIT_S)}
    start = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "build", str(book), "-W", "-n",
                           "--keep-going"], capture_output=True, text=True, env=env, timeout=LIMIT_S + 240)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert "stuck.ipynb" in output and "CellTimeoutError" in output
    assert "hung at cell 2 (`import time  # this cell never returns`)" in output
    assert time.monotonic() - start < LIMIT_S + 240


def test_the_book_build_runs_two_notebooks_at_once_and_pages_get_their_own_outputs(tmp_path):
    """The build starts its notebooks ahead of reading, two at a time: the kernels' busy intervals overlap,
    and each page still shows its own notebook's output."""
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    record = ("import time, pathlib\nstart = time.time()\ntime.sleep(4)\n"
              f"pathlib.Path({str(stamps)!r}, {{name!r}}).write_text(f'{{{{start}}}} {{{{time.time()}}}}')\n"
              "print('output of {name}')")
    book = _tiny_book(tmp_path, {name: notebook(record.format(name=name)) for name in ("first", "second")})
    done = subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "build", str(book), "-W", "-n",
                           "--keep-going"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SERVELAB_BOOK_JOBS": "2"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (a0, a1), (b0, b1) = (map(float, (stamps / name).read_text().split()) for name in ("first", "second"))
    assert a0 < b1 and b0 < a1, "the two notebooks ran one after the other"
    for name, other in (("first", "second"), ("second", "first")):
        page = (book / "_build" / "html" / f"{name}.html").read_text()
        assert f"output of {name}" in page and f"output of {other}" not in page


def test_the_book_build_fails_a_checked_output_that_differs_from_the_committed_one(tmp_path):
    """A fresh run's checked cells must print what the notebook was committed with: the cell that does
    is accepted, the one whose saved output is stale fails the build, named with the field it differs in."""
    nb = notebook("print(6 * 7)", "print(6 * 8)", "print('not checked')")
    for cell, saved in zip(nb.cells, ("42\n", "47\n", "anything\n")):
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=saved)]
    for cell in nb.cells[:2]:
        cell.metadata["tags"] = ["nbval-check-output"]
    book = _tiny_book(tmp_path, {"stale": nb})
    done = subprocess.run([str(Path(sys.executable).parent / "jupyter-book"), "build", str(book), "-W", "-n",
                           "--keep-going"], capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert "1 checked output(s) differ from the committed ones" in output
    assert "cell 1 (`print(6 * 8)`): stdout was '47\\n', now '48\\n'" in output
    assert "cell 0 (" not in output and "cell 2 (" not in output
