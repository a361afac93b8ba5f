"""tools/clean_install.py and tools/nbval_variants.py: what a run of the notebooks is compared against."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import clean_install  # noqa: E402


def test_glue_records_leave_the_saved_outputs_and_everything_else_stays():
    cell = nbformat.v4.new_code_cell("publish('x', 1)\nprint('shown')")
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={"application/papermill.record/text/plain": "1"}),
        nbformat.v4.new_output("stream", name="stdout", text="shown\n"),
        nbformat.v4.new_output("display_data", data={"text/plain": "fig",
                                                     "application/papermill.record/text/html": "<b>"}),
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t"), cell])
    clean_install.without_glue_records(nb)
    assert [o["output_type"] for o in nb.cells[1].outputs] == ["stream", "display_data"]
    assert nb.cells[1].outputs[1]["data"] == {"text/plain": "fig"}
    nbformat.validate(nb)


def test_a_variant_copy_ends_at_its_last_checked_cell(tmp_path):
    import nbval_variants

    cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("x"),
             nbformat.v4.new_markdown_cell("after"), nbformat.v4.new_code_cell("slow_timing()")]
    cells[1].metadata["tags"] = ["nbval-check-output"]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    nbval_variants.up_to_last_checked(path)
    cut = nbformat.read(path, as_version=4)
    assert [c.source for c in cut.cells] == ["x = 1", "x"]
    nbformat.validate(cut)
