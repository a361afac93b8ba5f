"""Batch grading: execute every student's exercise notebooks and write points per exercise and per case.

Layout of ``SUBMISSIONS_DIR``: one folder per student, holding that student's copies of the exercise
notebooks under their shipped names (``alice/ex03-block-allocator.ipynb``); a notebook directly in
``SUBMISSIONS_DIR`` is graded as the student named by the part of its name before ``__``
(``alice__ex03-block-allocator.ipynb``). Notebooks whose stem is not an exercise are skipped.

Each notebook runs in a fresh kernel with nbclient, with a wall-clock limit per notebook, its set-up
cell left out (it would pip-install on a machine without servelab). Cells that raise do not stop the
run: the grader then appends one cell of its own that calls the exercise's checkers on the names the
notebook defined and prints the result as JSON. A notebook that times out, kills its kernel or never
defines the names scores 0 on every case, with the reason in the ``note`` column.

System boundary: the grader runs student code as the current user in the current environment; run
it in a sandbox (a container, a throwaway account) for untrusted submissions.
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError

from servelab._validate import require_real
from servelab.exercises.catalog import EXERCISES, Exercise, exercise_for

__all__ = ["CaseGrade", "grade_notebook", "grade_submissions", "write_grades"]

_MARK = "SERVELAB-GRADE-JSON:"
_SETUP_PREFIX = "# Set-up:"
COLUMNS = ("student", "exercise", "case", "points", "max_points", "note")


@dataclass(frozen=True)
class CaseGrade:
    """One row of the grade sheet; ``case`` is ``"TOTAL"`` on an exercise's total row."""

    student: str
    exercise: str
    case: str
    points: int
    max_points: int
    note: str = ""


def _grading_cell(exercise: Exercise) -> str:
    """Source of the cell the grader appends: run each checker on the notebook's names, print JSON."""
    calls = [(check.__module__, check.__name__, names) for check, names in exercise.checks]
    return (
        "import importlib as _il, json as _json\n"
        f"_out = []\nfor _mod, _fn, _names in {calls!r}:\n"
        "    _check = getattr(_il.reload(_il.import_module(_mod)), _fn)\n"
        "    _missing = [n for n in _names if n not in globals()]\n"
        "    _r = _check(*[globals().get(n) for n in _names], verbose=False) if not _missing else None\n"
        "    _out.append({'checker': _fn, 'missing': _missing, 'cases': [] if _r is None else "
        "[[c.name, c.points, c.max_points, c.detail] for c in _r.cases]})\n"
        f"print({_MARK!r} + _json.dumps(_out))\n"
    )


def _prepare(path: Path, exercise: Exercise) -> nbformat.NotebookNode:
    nb = nbformat.read(str(path), as_version=4)
    nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and c.source.startswith(_SETUP_PREFIX))]
    nb.cells.append(nbformat.v4.new_code_cell(_grading_cell(exercise)))
    return nb


class _OverTime(Exception):
    """The notebook used up its time limit."""


def _execute(nb: nbformat.NotebookNode, folder: Path, time_limit: float) -> None:
    """Run every cell in one fresh kernel; each cell may use what is left of the notebook's limit."""
    client = NotebookClient(nb, allow_errors=True, kernel_name="python3", shutdown_kernel="immediate",
                            resources={"metadata": {"path": str(folder)}})
    deadline = time.monotonic() + time_limit
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.timeout = math.ceil(deadline - time.monotonic())
            if client.timeout <= 0:
                raise _OverTime
            try:
                client.execute_cell(cell, index)
            except CellTimeoutError:
                raise _OverTime from None


def _first_error(nb: nbformat.NotebookNode) -> str:
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"cell {index} raised {out.get('ename')}: {out.get('evalue')}"
    return ""


def _report(nb: nbformat.NotebookNode) -> list[dict] | None:
    for out in nb.cells[-1].get("outputs", []):
        for line in out.get("text", "").splitlines():
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK):])
    return None


def _zero_rows(student: str, exercise: Exercise, note: str, checks: tuple | None = None) -> list[CaseGrade]:
    """Every case of ``checks`` (default: all the exercise's) at 0 points, from a run on stubs."""
    rows = []
    for check, names in checks or exercise.checks:
        stubs = [_not_implemented] * len(names)
        rows += [CaseGrade(student, exercise.stem, c.name, 0, c.max_points, note)
                 for c in check(*stubs, verbose=False).cases]
    return rows


def _not_implemented(*args: object, **kwargs: object) -> None:
    raise NotImplementedError


def _rows_from(student: str, exercise: Exercise, report: list[dict], crash: str) -> list[CaseGrade]:
    rows: list[CaseGrade] = []
    for (check, names), entry in zip(exercise.checks, report):
        if entry["missing"]:
            note = f"not defined: {', '.join(entry['missing'])}" + (f"; {crash}" if crash else "")
            rows += _zero_rows(student, exercise, note, ((check, names),))
            continue
        rows += [CaseGrade(student, exercise.stem, name, points, max_points, detail.splitlines()[0] if detail else "")
                 for name, points, max_points, detail in entry["cases"]]
    return rows


def grade_notebook(path: str | Path, student: str, time_limit: float = 60.0) -> list[CaseGrade]:
    """Execute one student's exercise notebook and return one row per case plus the exercise's total row."""
    path = Path(path)
    require_real("time_limit", time_limit, 0, strict_min=True)
    exercise = exercise_for(path.stem.split("__")[-1])
    try:
        nb = _prepare(path, exercise)
        _execute(nb, path.parent, time_limit)
        report, crash = _report(nb), _first_error(nb)
    except _OverTime:
        report, crash = None, f"timed out after {time_limit:g} s"
    except Exception as exc:  # a dead kernel or an unreadable notebook scores 0, the batch goes on
        report, crash = None, f"the notebook could not run: {type(exc).__name__}: {exc}"
    if report is None:
        rows = _zero_rows(student, exercise, crash or "the grading cell did not run")
    else:
        rows = _rows_from(student, exercise, report, crash)
    total = CaseGrade(student, exercise.stem, "TOTAL", sum(r.points for r in rows),
                      sum(r.max_points for r in rows), crash)
    return [*rows, total]


def _submissions(folder: Path) -> list[tuple[str, Path]]:
    """(student, notebook) pairs, sorted, for every notebook whose stem names an exercise."""
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        stem = path.stem.split("__")[-1]
        if stem not in EXERCISES:
            continue
        student = path.stem.split("__")[0] if path.parent == folder else path.relative_to(folder).parts[0]
        found.append((student, path))
    return found


def grade_submissions(folder: str | Path, time_limit: float = 60.0) -> list[CaseGrade]:
    """Grade every submission under ``folder``; ValueError when it holds no exercise notebook."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"submissions must be a folder, got {str(folder)!r}")
    pairs = _submissions(folder)
    if not pairs:
        raise ValueError(f"no exercise notebook ({', '.join(sorted(EXERCISES))}) under {folder}")
    return [row for student, path in pairs for row in grade_notebook(path, student, time_limit)]


def write_grades(rows: list[CaseGrade], out: str | Path) -> Path:
    """Write the grade sheet as CSV with the columns of :data:`COLUMNS`; returns the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows((r.student, r.exercise, r.case, r.points, r.max_points, r.note) for r in rows)
    return out
