"""tools/sync_notebooks.py: nbval markers become tags nbval reads; publish-only cells lose their input."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
from nbval.plugin import find_comment_markers, find_metadata_tags

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sync_notebooks", ROOT / "tools" / "sync_notebooks.py")
sync = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync)


def _nb(*sources: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), *map(nbformat.v4.new_code_cell, sources)]
    return nb


def test_check_marker_becomes_a_tag_nbval_honours():
    nb = sync.synced(_nb("# NBVAL_CHECK_OUTPUT\nprint(round(1 / 3, 4))"), "pass")
    cell = nb.cells[2]
    assert cell.source == "print(round(1 / 3, 4))"
    assert cell.metadata["tags"] == ["nbval-check-output"]
    assert dict(find_metadata_tags(cell.metadata)) == {"check": True}  # nbval 0.11 reads the tag
    assert not dict(find_comment_markers(cell.source))


def test_other_markers_and_idempotence():
    nb = sync.synced(_nb("# NBVAL_SKIP\nx = 1", "#NBVAL_IGNORE_OUTPUT\ny = 2  # NBVAL_CHECK_OUTPUT"), "pass")
    assert nb.cells[2].metadata["tags"] == ["nbval-skip"]
    assert nb.cells[3].metadata["tags"] == ["nbval-ignore-output"]
    assert nb.cells[3].source == "y = 2  # NBVAL_CHECK_OUTPUT"  # only leading marker lines move
    again = sync.synced(nb, "pass")
    assert sync.render(again) == sync.render(nb)


def test_publish_only_cells_lose_their_input_in_the_book():
    cells = ['publish("a", 1)\npublish("b",\n        round(2.5, 1))  # a comment',
             'x = 3\npublish("c", x)', 'glue("d", 4)', "", 'publish("e", 5); print(5)']
    nb = sync.synced(_nb(*cells), "pass")
    tagged = ["remove-input" in c.metadata.get("tags", []) for c in nb.cells[2:]]
    assert tagged == [True, False, True, False, False]
