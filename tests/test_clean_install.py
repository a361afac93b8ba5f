"""tools/clean_install.py and tools/cpu_variant.py: what a run of the notebooks is compared against."""

from __future__ import annotations

import os
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


def test_a_copy_ends_at_its_last_checked_cell_and_one_without_checked_cells_stays_whole():
    cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("x"),
             nbformat.v4.new_markdown_cell("after"), nbformat.v4.new_code_cell("slow_timing()")]
    cells[1].metadata["tags"] = ["nbval-check-output"]
    nb = nbformat.v4.new_notebook(cells=cells)
    clean_install.up_to_last_checked(nb)
    assert [c.source for c in nb.cells] == ["x = 1", "x"]
    whole = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("y = 2"), nbformat.v4.new_code_cell("y")])
    clean_install.up_to_last_checked(whole)
    assert len(whole.cells) == 2


def test_a_top_level_import_the_clean_install_lacks_is_named_and_a_nested_one_is_optional(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("try:\n    from google.colab import output\nexcept ImportError:\n    pass"),
        nbformat.v4.new_code_cell("%matplotlib inline\nimport json\nfrom servelab.kv import arithmetic"),
        nbformat.v4.new_code_cell("import no_such_module_here\nfrom no_such_package.sub import x"),
    ])
    assert clean_install.top_level_imports(nb) == [(1, "json"), (1, "servelab.kv"), (2, "no_such_module_here"),
                                                   (2, "no_such_package.sub")]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    missing = clean_install.missing_imports([path], Path(sys.executable), tmp_path, dict(os.environ))
    assert missing == ["nb.ipynb cell 2 imports no_such_module_here", "nb.ipynb cell 2 imports no_such_package.sub"]
