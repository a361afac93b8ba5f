"""Run notebooks many times through each of the course's notebook runners, with the cores kept busy,
and count the runs that hang.

A run *hangs* when it is still going at ``--limit`` seconds (it is then killed with its kernel and the
cell it was running is named). The runners:

* ``stock``: plain ``nbclient.NotebookClient`` as the runners used it before (the "before" figure);
* ``nbrun``: :func:`nbrun.run_notebook`, which ``tools/execute_notebooks.py`` and
  ``tools/clean_install.py`` use;
* ``book``: the book build's executor (``book/_ext/servelab_book.py``), with the build's environment;
* ``nbval``: ``tools/run_nbval.py``, one notebook per pytest process.

``--burn N`` starts N busy-looping processes for the duration (default: one per core).
``--widget-cells N`` adds a generated notebook of N live-control cells (``sampling_controls``), the
kind of cell after which the stalls were seen, to make a rare stall common enough to count.

Usage::

    python tools/stress_notebooks.py --runs 20 --runners stock,nbrun,book notebooks/ch03-sampling.ipynb
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "book" / "_ext"))

from nbrun import run_command, run_notebook  # noqa: E402

STOCK = """
import sys, nbformat
from pathlib import Path
from nbclient import NotebookClient
path = Path(sys.argv[1])
nb = nbformat.read(path, as_version=4)
NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
               resources={"metadata": {"path": str(path.parent)}}).execute()
"""


def run_once(runner: str, notebook: Path, limit_s: float) -> tuple[bool, float, str]:
    """One run: (hung, seconds, where it hung or '')."""
    if runner == "stock":
        done = run_command([sys.executable, "-c", STOCK, str(notebook)], limit_s=limit_s, cwd=ROOT)
        return done.timed_out, done.seconds, "stock nbclient" if done.timed_out else ""
    if runner == "nbrun":
        run = run_notebook(notebook, limit_s=limit_s, cwd=notebook.parent, cell_timeout_s=300,
                           allow_errors=True)
        return run.timed_out, run.seconds, run.where() if run.timed_out else ""
    if runner == "book":
        import nbformat
        from servelab_book import NOTEBOOK_LIMIT_ENV, execute_with_deadline

        env = {"SERVELAB_BOOK_BUILD": "1", NOTEBOOK_LIMIT_ENV: str(limit_s)}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            start = time.monotonic()
            result = execute_with_deadline(nbformat.read(notebook, as_version=4), str(notebook.parent), 300, True)
        finally:
            for key, value in saved.items():
                os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
        hung = type(result.err).__name__ == "CellTimeoutError"
        return hung, time.monotonic() - start, result.exc_string if hung else ""
    if runner == "nbval":
        from run_nbval import nbval_once

        run = nbval_once(notebook, None, limit_s)
        return run.run.timed_out, run.run.seconds, run.hung_at
    raise SystemExit(f"unknown runner {runner!r}: use stock, nbrun, book or nbval")


def widget_notebook(cells: int, folder: Path) -> Path:
    """A notebook of ``cells`` live ipywidgets controls, each followed by a one-line cell."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("import numpy as np\nfrom servelab.viz import sampling as vs\n"
                                          "z = np.linspace(3, -3, 12)\nlabels = [f't{i}' for i in range(12)]")]
    for index in range(cells):
        nb.cells += [nbformat.v4.new_code_cell(f"vs.sampling_controls(z, labels, show_top={5 + index % 5})"),
                     nbformat.v4.new_code_cell(f"x = {index}\nx")]
    path = folder / f"widgets-{cells}.ipynb"
    nbformat.write(nb, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--runners", default="stock,nbrun,book,nbval")
    parser.add_argument("--limit", type=float, default=150.0, help="seconds before a run counts as hung")
    parser.add_argument("--burn", type=int, default=os.cpu_count() or 1, help="busy processes beside it")
    parser.add_argument("--widget-cells", type=int, default=0, help="add a generated widget notebook")
    args = parser.parse_args(argv)
    if args.widget_cells:
        import tempfile

        args.notebooks.append(widget_notebook(args.widget_cells, Path(tempfile.mkdtemp(prefix="servelab-stress-"))))
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burn)]
    hangs: Counter = Counter()
    try:
        for runner in args.runners.split(","):
            for notebook in args.notebooks:
                times = []
                for index in range(args.runs):
                    hung, seconds, where = run_once(runner, notebook.resolve(), args.limit)
                    times.append(seconds)
                    hangs[runner, notebook.name] += hung
                    if hung:
                        print(f"  HANG {runner} {notebook.name} run {index + 1}: {where}", flush=True)
                times.sort()
                print(f"{runner:5} {notebook.name}: {hangs[runner, notebook.name]} hung in {args.runs} runs "
                      f"(median {times[len(times) // 2]:.1f} s, max {times[-1]:.1f} s, {args.burn} busy "
                      "processes beside it)", flush=True)
    finally:
        for burner in burners:
            burner.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
