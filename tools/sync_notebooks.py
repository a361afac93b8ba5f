"""Keep every course notebook in the shape the book, nbval and Colab expect.

For each notebook under ``notebooks/`` (or the ones named on the command line) this

* puts the set-up cell right under the title cell: on Colab (or anywhere ``servelab`` is missing)
  it pip-installs the library from the repository named in ``_config.yml`` (the one place the URL is
  set), then picks the device and dtype with ``servelab.device.pick_device`` (``DEVICE, DTYPE``: CUDA
  and bfloat16 when a GPU is there, else CPU and float32). The cell is tagged
  ``remove-cell`` so the book does not show it;
* gives every cell a stable, unique id, sets the ``python3`` kernel and drops saved widget state;
* moves nbval's comment markers into cell tags, so a reader never sees them: a leading
  ``# NBVAL_CHECK_OUTPUT`` line becomes the tag ``nbval-check-output`` (likewise
  ``NBVAL_IGNORE_OUTPUT``, ``NBVAL_SKIP``, ``NBVAL_RAISES_EXCEPTION``); nbval 0.11 reads these tags
  exactly as it reads the comments (``nbval.plugin.find_metadata_tags``);
* tags ``remove-input`` on a cell whose every statement is a ``publish(...)`` call: it only hands
  values to the narrative page, so its code is not shown in the book.

Outputs are kept: ``tools/execute_notebooks.py`` writes real ones, and nbval compares the cells
tagged ``nbval-check-output`` against them.

Usage::

    python tools/sync_notebooks.py            # rewrite notebooks in place
    python tools/sync_notebooks.py --check    # exit 1 if any notebook would change (used by make test)
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import nbformat
import yaml

from servelab.prose import count

ROOT = Path(__file__).resolve().parent.parent
SETUP_ID = "servelab-setup"
SETUP_TEMPLATE = '''\
# Set-up. Where servelab is missing (e.g. Colab) this installs the course library and its declared
# dependencies; pip keeps every package already present in a compatible version (torch included).
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("servelab") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "git+{url}@{branch}"], check=True)
if "google.colab" in sys.modules:
    from google.colab import output
    output.enable_custom_widget_manager()  # ipywidgets 8 controls need it on Colab

from servelab.device import pick_device

DEVICE, DTYPE = pick_device()  # CUDA + bfloat16 with a GPU, else CPU + float32 (SERVELAB_DEVICE/DTYPE override)'''
NBVAL_MARKERS = ("NBVAL_CHECK_OUTPUT", "NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP", "NBVAL_RAISES_EXCEPTION")
PUBLISH_CALLS = {"publish", "glue"}
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def setup_source(config_path: Path = ROOT / "_config.yml") -> str:
    """The set-up cell's code, with the repository URL and branch read from ``_config.yml``."""
    repo = yaml.safe_load(config_path.read_text())["repository"]
    url, branch = repo["url"].rstrip("/"), repo.get("branch", "main")
    if not url.startswith("https://"):
        raise ValueError(f"repository.url in {config_path} must be an https URL, got {url!r}")
    return SETUP_TEMPLATE.format(url=url, branch=branch)


def setup_cell(source: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source, id=SETUP_ID)
    cell.metadata["tags"] = ["remove-cell"]
    return cell


def add_tag(cell: nbformat.NotebookNode, tag: str) -> None:
    tags = cell.metadata.setdefault("tags", [])
    if tag not in tags:
        tags.append(tag)


def markers_to_tags(cell: nbformat.NotebookNode) -> None:
    """Leading ``# NBVAL_...`` comment lines of a code cell become nbval's cell tags."""
    lines = cell.source.split("\n")
    while lines and lines[0].strip().lstrip("#").strip() in NBVAL_MARKERS \
            and lines[0].strip().startswith("#"):
        add_tag(cell, lines.pop(0).strip().lstrip("#").strip().lower().replace("_", "-"))
    cell.source = "\n".join(lines)


def only_publishes(source: str) -> bool:
    """True when every statement of ``source`` is a bare ``publish(...)`` (or ``glue(...)``) call."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    return bool(body) and all(
        isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
        and getattr(s.value.func, "id", getattr(s.value.func, "attr", None)) in PUBLISH_CALLS
        for s in body)


def tidy_code_cell(cell: nbformat.NotebookNode) -> None:
    """nbval markers as tags, publish-only cells without their input in the book."""
    markers_to_tags(cell)
    if only_publishes(cell.source):
        add_tag(cell, "remove-input")


def synced(nb: nbformat.NotebookNode, source: str) -> nbformat.NotebookNode:
    """A copy of ``nb`` with the set-up cell under the title, stable ids and the python3 kernel."""
    nb = nbformat.from_dict(nb)
    fresh = setup_cell(source)
    old = [c for c in nb.cells if c.get("id") == SETUP_ID]
    if old and old[0].source == fresh.source and old[0].metadata == fresh.metadata:
        fresh = old[0]  # unchanged: keep its execution count from the last run
    cells = [c for c in nb.cells if c.get("id") != SETUP_ID]
    # Right under the title cell when there is one, so Colab opens on the title, then set-up.
    at = 1 if cells and cells[0].cell_type == "markdown" \
        and cells[0].source.lstrip().startswith("# ") else 0
    nb.cells = [*cells[:at], fresh, *cells[at:]]
    used = {SETUP_ID}
    for i, cell in enumerate(nb.cells):
        if cell.get("id") == SETUP_ID:
            continue
        if cell.cell_type == "code":
            tidy_code_cell(cell)
        if not cell.get("id") or cell.id in used:
            cell.id = f"cell-{i}"
        used.add(cell.id)
        cell.metadata.pop("execution", None)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata.pop("widgets", None)
    nb.nbformat, nb.nbformat_minor = 4, 5
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb, version=4) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to sync (default: notebooks/**/*.ipynb)")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a notebook is out of sync")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").rglob("*.ipynb"))
    paths = [p for p in paths if ".ipynb_checkpoints" not in p.parts]
    source = setup_source()
    stale = []
    for path in paths:
        text = path.read_text()
        new = render(synced(nbformat.reads(text, as_version=4), source))
        nbformat.validate(nbformat.reads(new, as_version=4))
        if new != text:
            stale.append(path)
            if not args.check:
                path.write_text(new)
    verb = "out of sync" if args.check else "rewritten"
    for path in stale:
        print(f"{verb}: {path}")
    if args.check and stale:
        print("run: .venv/bin/python tools/sync_notebooks.py", file=sys.stderr)
        return 1
    print(f"{count(len(paths), 'notebook')} checked, {len(stale)} {verb}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
