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


def test_the_cpu_variant_changes_the_kernel_family_and_the_threads():
    import cpu_variant

    name, overrides = cpu_variant.cpu_variant()
    assert overrides["OMP_NUM_THREADS"] == "2"
    assert overrides["ATEN_CPU_CAPABILITY"].upper() != cpu_variant.native_capability()
    cpu_variant.check_forced({**os.environ, **overrides})
