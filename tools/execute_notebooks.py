"""Execute course notebooks in place, so their committed outputs are real, and report on each.

For every notebook named this runs all cells in the notebook's folder (as the book and nbval do),
writes the outputs back (then the notebook is synced, see ``sync_notebooks.py``), and prints the
wall time, the file size and any problem found:

* a cell that raised (the notebook is then left unchanged);
* an output the static book cannot draw: plotly's JSON without HTML (a bare ``fig.show()``: use
  ``servelab.viz.show``), or a widget view with nothing else (a control that would be dead in the
  HTML: use ``servelab.viz.live_controls`` or tag the cell ``remove-output``);
* a figure that loads plotly.js itself (it would embed 4.9 MB or need the network).

The book never uses these saved outputs: it executes every notebook again while it builds.

Every notebook of one invocation reads one machine profile (:mod:`servelab.bench.machine`):
``$SERVELAB_MACHINE_PROFILE`` if set, else ``_build/machine-profile.json``, measured by the first
notebook that reads it when it is missing (``--fresh-profile`` measures it again), so the committed
notebooks name one machine. A run
that writes notebooks back copies that profile to ``notebooks/machine-profile.json``, the record of
the machine the committed outputs came from (the README points there).

Each notebook runs in a process of its own under a hard wall-clock limit (``--limit``, enforced from
outside it by :func:`nbrun.run_notebook`): a notebook that hangs is killed, kernel and all,
and reported with the cell it was running.

Usage::

    python tools/execute_notebooks.py notebooks/ch00-state-machine.ipynb
    python tools/execute_notebooks.py --dry-run notebooks/*.ipynb     # run and report, write nothing
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import nbformat

from servelab.bench.machine import PROFILE_ENV
from nbrun import NotebookRun, run_notebook

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sync_notebooks import render, setup_source, synced  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COMMITTED_PROFILE = ROOT / "notebooks" / "machine-profile.json"
PLOTLY_JSON = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def output_problems(nb: nbformat.NotebookNode) -> list[str]:
    """Outputs that would vanish, look dead or pull in plotly.js in the static book."""
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.get("tags", [])
        hidden = "remove-output" in tags or "remove-cell" in tags
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            html = data.get("text/html", "")
            where = f"cell {index}"
            if PLOTLY_JSON in data and not html:
                problems.append(f"{where}: bare plotly figure (use servelab.viz.show)")
            if WIDGET_VIEW in data and not html and not hidden:
                problems.append(f"{where}: widget with no static twin would be dead in the book "
                                "(use servelab.viz.live_controls or tag the cell remove-output)")
            foreign_cdn = "cdn.plot.ly" in html and "servelab-fig-" not in html
            if foreign_cdn or "plotly.js v" in html:
                problems.append(f"{where}: figure loads or embeds plotly.js itself")
    return problems


NOTEBOOK_LIMIT_S = 600
"""The hard wall-clock limit for one notebook, kernel start included (seconds)."""


def execute(path: Path, timeout: int, allow_errors: bool = False, limit_s: float = NOTEBOOK_LIMIT_S,
            **kwargs) -> NotebookRun:
    """Execute one notebook in its folder, in a process of its own killed at ``limit_s``; ``timeout``
    is nbclient's per-cell limit inside it. With ``allow_errors`` every cell runs and each error stays
    in its cell's outputs. Other keywords (``python``, ``env``) go to :func:`run_notebook`."""
    path = path.resolve()  # the kernel's folder must not be read relative to the runner's own
    return run_notebook(path, limit_s=limit_s, cwd=path.parent, cell_timeout_s=timeout,
                        allow_errors=allow_errors, **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    parser.add_argument("--limit", type=float, default=NOTEBOOK_LIMIT_S,
                        help=f"hard limit per notebook in seconds (default {NOTEBOOK_LIMIT_S})")
    parser.add_argument("--dry-run", action="store_true", help="report only; write nothing back")
    parser.add_argument("--fresh-profile", action="store_true",
                        help="measure this machine's profile again before running")
    args = parser.parse_args(argv)
    profile = Path(os.environ.setdefault(PROFILE_ENV, str(ROOT / "_build" / "machine-profile.json")))
    if args.fresh_profile:
        profile.unlink(missing_ok=True)  # the first notebook that reads it measures it again
    source = setup_source()
    failed = 0
    for path in args.notebooks:
        run = execute(path, args.timeout, limit_s=args.limit)
        if not run.ok:
            print(f"FAIL {path}  {run.seconds:6.1f} s\n     - {'hung' if run.timed_out else 'error'} at "
                  f"{run.where()}: {run.error}")
            failed += 1
            continue
        problems = output_problems(run.notebook)
        text = render(synced(run.notebook, source))
        if not args.dry_run:
            path.write_text(text)
        status = "FAIL" if problems else "ok"
        print(f"{status:4} {path}  {run.seconds:6.1f} s  {len(text) / 1024:8.0f} KiB")
        for problem in problems:
            print(f"     - {problem}")
        failed += bool(problems)
    if not args.dry_run and len(args.notebooks) > failed and profile.is_file():
        shutil.copyfile(profile, COMMITTED_PROFILE)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
