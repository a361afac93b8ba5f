"""The book's text as a reader reads it, page by page, and the direction of its claims across two
builds.

Two ways to get the pages (name -> text, tags stripped):

* :func:`built_pages`: a built book's HTML (``_build/html``);
* :func:`source_pages`: each chapter with its ``{glue:text}`` values filled in from a folder of
  executed notebooks, plus what those notebooks print, without building the book.

Run as a script it compares two executions of the same sources claim by claim
(:func:`servelab.bench.claims.verdict_changes`) and exits 1 if any claim changed direction
(faster / slower / no difference)::

    python tools/book_pages.py notebooks /tmp/second-run/notebooks
    python tools/book_pages.py --html _build/html /tmp/second-build/_build/html
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

from servelab.bench.claims import page_text, verdict_changes, verdicts

ROOT = Path(__file__).resolve().parents[1]
GLUE_TEXT = re.compile(r"\{glue:text\}`\.\./notebooks/([\w./-]+\.ipynb)::(\w+):([^`]*)`")
SKIPPED = {"_static", "_sources", "_images"}


def built_pages(html_dir: Path) -> dict[str, str]:
    """Every page of a built book, by its path under ``html_dir``."""
    return {
        str(p.relative_to(html_dir)): page_text(p.read_text(encoding="utf-8"))
        for p in sorted(html_dir.rglob("*.html"))
        if not SKIPPED.intersection(p.relative_to(html_dir).parts)
    }


def profile_values(path: Path) -> dict[str, float] | None:
    """A machine profile's quantities (:mod:`servelab.bench.machine`) in the units the pages print
    (:data:`servelab.bench.claims.PROFILE_PATTERNS`); None where there is no profile file."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return {"read bandwidth (GB/s)": data["read_bandwidth"] / 1e9,
            "fp32 matmul peak (GFLOP/s)": data["peak_flops"]["float32"] / 1e9,
            "bf16 matmul peak (GFLOP/s)": data["peak_flops"]["bfloat16"] / 1e9,
            "one empty operator (µs)": data["op_overhead_s"] * 1e6}


def glued(notebook: Path) -> dict[str, object]:
    """The values an executed notebook publishes, by name."""
    values = {}
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            text = output.get("data", {}).get("application/papermill.record/text/plain")
            if name and text:
                try:
                    values[name] = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    values[name] = text
    return values


def printed(notebook: Path) -> str:
    """What an executed notebook's cells print (streams and plain-text results)."""
    parts = []
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            parts.append("".join(output.get("text", "")))
            parts.append("".join(output.get("data", {}).get("text/plain", "")))
    return page_text(" ".join(parts))


def chapter_with_values(page: Path, notebooks: Path, cache: dict[str, dict]) -> str:
    """A chapter's text with each ``{glue:text}`` replaced by its value in ``notebooks``,
    formatted."""

    def value(match: re.Match) -> str:
        notebook, name, spec = match.groups()
        values = cache.setdefault(notebook, glued(notebooks / notebook))
        if name not in values:
            return match.group(0)
        try:
            return format(values[name], spec)
        except (TypeError, ValueError):
            return str(values[name])

    return page_text(GLUE_TEXT.sub(value, page.read_text(encoding="utf-8")))


def source_pages(notebooks: Path, book: Path = ROOT / "book") -> dict[str, str]:
    """Every chapter filled in from ``notebooks``, and every notebook's printed outputs."""
    cache: dict[str, dict] = {}
    pages = {p.name: chapter_with_values(p, notebooks, cache) for p in sorted(book.glob("*.md"))}
    return pages | {p.name: printed(p) for p in sorted(notebooks.glob("*.ipynb"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="notebooks folder (or built HTML with --html)")
    parser.add_argument("second", type=Path, help="the same, from a second run")
    parser.add_argument("--html", action="store_true", help="compare two built books")
    args = parser.parse_args(argv)
    read = built_pages if args.html else source_pages
    first, second = read(args.first), read(args.second)
    claims = sum(len(verdicts(text)) for text in first.values())
    changes = verdict_changes(first, second)
    print(f"{claims} banded claims on {len(first)} pages; {len(changes)} changed direction")
    for change in changes:
        print(f"  {change}")
    return 1 if changes else 0


if __name__ == "__main__":
    sys.exit(main())
