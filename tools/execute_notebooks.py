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

Usage::

    python tools/execute_notebooks.py notebooks/ch00-state-machine.ipynb
    python tools/execute_notebooks.py --dry-run notebooks/*.ipynb     # run and report, write nothing
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sync_notebooks import render, setup_source, synced  # noqa: E402

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


def execute(path: Path, timeout: int, allow_errors: bool = False) -> tuple[nbformat.NotebookNode, float, str | None]:
    """Execute one notebook in its folder; return it, the wall time and the error (if any). With
    ``allow_errors`` every cell runs and each error stays in its cell's outputs instead."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    try:
        client.execute()
        error = None
    except CellExecutionError as exc:
        error = str(exc).strip().splitlines()[-1]
    return nb, time.perf_counter() - start, error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    parser.add_argument("--dry-run", action="store_true", help="report only; write nothing back")
    args = parser.parse_args(argv)
    source = setup_source()
    failed = 0
    for path in args.notebooks:
        nb, seconds, error = execute(path, args.timeout)
        problems = ([f"error: {error}"] if error else []) + output_problems(nb)
        text = render(synced(nb, source))
        if not error and not args.dry_run:
            path.write_text(text)
        status = "FAIL" if problems else "ok"
        print(f"{status:4} {path}  {seconds:6.1f} s  {len(text) / 1024:8.0f} KiB")
        for problem in problems:
            print(f"     - {problem}")
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
