"""A failing stage of `make test` names its cause at the end of the output: tools/stage.sh keeps the
lines that name what broke, and the notebook runner names the notebook, the cell and the exception."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import run_nbval  # noqa: E402

NBVAL_FAILURE = """bad::ipynb::Cell 0 PASSED
bad::ipynb::Cell 1 FAILED
=================================== FAILURES ===================================
______________________________ bad.ipynb::Cell 1 _______________________________
\x1b[91mNotebook cell execution failed\x1b[0m
\x1b[94mCell 1: Cell execution caused an exception

Input:
\x1b[0mimport torch
raise RuntimeError('pack_vnni2 is only supported when avx512 is supported')

\x1b[31mRuntimeError\x1b[39m                              Traceback (most recent call last)
\x1b[31mRuntimeError\x1b[39m: pack_vnni2 is only supported when avx512 is supported

=========================== short test summary info ============================
FAILED bad.ipynb::Cell 1 - Notebook cell execution failed
========================= 1 failed, 1 passed in 12.73s =========================
"""


def test_nbval_failure_names_notebook_cell_and_exception(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_markdown_cell("m"),
                                         nbformat.v4.new_code_cell("import torch\nraise RuntimeError()")])
    path = tmp_path / "bad.ipynb"
    nbformat.write(nb, path)
    cause = run_nbval.failure_cause(path, NBVAL_FAILURE)
    assert cause == (f"{path} cell 1 (`import torch`): "
                     "RuntimeError: pack_vnni2 is only supported when avx512 is supported")


def test_output_mismatch_gives_nbvals_reason(tmp_path):
    path = tmp_path / "nb.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(2)")]), path)
    text = "____ nb.ipynb::Cell 0 ____\nNotebook cell execution failed\nCell 0: Cell outputs differ\n\n"
    assert run_nbval.failure_cause(path, text).endswith("cell 0 (`print(2)`): Cell outputs differ")


def stage(tmp_path: Path, name: str, *command: str) -> int:
    env = {**os.environ, "STAGE_LOG": str(tmp_path / "times")}
    return subprocess.run(["bash", str(ROOT / "tools" / "stage.sh"), name, "20", *command], env=env,
                          capture_output=True, text=True).returncode


def test_a_failed_stage_leaves_its_cause_and_a_passing_one_none(tmp_path):
    assert stage(tmp_path, "fine", "bash", "-c", "echo ok") == 0
    assert not (tmp_path / "times.causes").exists()
    script = "echo noise; echo 'FAILED tests/test_x.py::test_y - AssertionError: 3 != 4'; exit 1"
    assert stage(tmp_path, "lib", "bash", "-c", script) == 1
    assert stage(tmp_path, "quiet", "bash", "-c", "echo last words; exit 2") == 2
    causes = (tmp_path / "times.causes").read_text()
    assert "stage lib: exit 1" in causes and "AssertionError: 3 != 4" in causes
    assert "noise" not in causes.split("stage quiet")[0]
    assert "stage quiet: exit 2" in causes and "last words" in causes  # no named line: its tail
    assert (tmp_path / "times.d" / "lib.log").read_text().startswith("noise")
