"""Grade sheets an LMS imports, a roster for missing students, and per-student feedback files.

* ``long`` -- one row per case and one ``TOTAL`` row per graded notebook: ``student, exercise, case,
  points, max_points, note, path`` (a note keeps its whole text, newlines included);
* ``canvas`` -- Canvas's gradebook CSV: ``Student, ID, SIS User ID, SIS Login ID, Section``, then
  one column per exercise and ``servelab total``; the second row is ``Points Possible``. A column
  whose name matches no assignment makes a new assignment on import (name it ``Title (assignment
  id)`` from a gradebook export to fill an existing one);
* ``moodle`` -- for Moodle's "Import grades from CSV file": ``First name, Last name, ID number,
  Email address``, then ``<exercise> (Real)`` per exercise and ``Total (Real)``; at import, map
  *Identify user by* to the column your roster fills (email or ID number) and each grade column
  to its grade item.

One row per student: per exercise the best-scoring copy counts (every copy is in ``long``). With a
roster (:func:`read_roster`) every student on it gets a row, 0 where nothing was submitted.
Files are written atomically (a temporary file in the same folder, then ``os.replace``).
"""

from __future__ import annotations

import csv
import io
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "FORMATS",
    "RosterEntry",
    "read_roster",
    "student_totals",
    "write_atomic",
    "write_feedback",
    "write_sheet",
]

FORMATS = ("long", "canvas", "moodle")
LONG_COLUMNS = ("student", "exercise", "case", "points", "max_points", "note", "path")
_ROSTER_FIELDS = (
    "student",
    "name",
    "id",
    "sis_user_id",
    "sis_login_id",
    "section",
    "first_name",
    "last_name",
    "id_number",
    "email",
)


@dataclass(frozen=True)
class RosterEntry:
    """One student of the course: ``student`` is the name their submissions carry; the rest fills
    LMS columns (any may be empty)."""

    student: str
    fields: dict[str, str] = field(default_factory=dict)

    def get(self, key: str) -> str:
        return self.fields.get(key, "")


def read_roster(path: str | Path) -> list[RosterEntry]:
    """A roster CSV with a ``student`` column and optionally ``name, id, sis_user_id, sis_login_id,
    section, first_name, last_name, id_number, email``; ValueError naming what is wrong."""
    with Path(path).open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        header = [h.strip() for h in reader.fieldnames or []]
        if "student" not in header:
            raise ValueError(
                f"roster must have a 'student' column (optional: {', '.join(_ROSTER_FIELDS[1:])}); "
                f"{path} has {header}"
            )
        unknown = sorted(set(header) - set(_ROSTER_FIELDS))
        if unknown:
            raise ValueError(
                f"roster columns must be among {list(_ROSTER_FIELDS)}; unknown: {unknown}"
            )
        entries = [
            RosterEntry(
                row["student"].strip(), {k.strip(): (v or "").strip() for k, v in row.items()}
            )
            for row in reader
            if (row.get("student") or "").strip()
        ]
    names = [e.student for e in entries]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"roster lists these students more than once: {repeated}")
    return entries


def student_totals(rows: Iterable, roster: list[RosterEntry] | None = None
                   ) -> tuple[list[str], dict[str, int], dict[str, dict[str, int]]]:
    """``(exercises, max points per exercise, {student: {exercise: points}})``, best copy per
    exercise; every roster student is present (0 for what they did not submit)."""
    totals = [r for r in rows if r.case == "TOTAL"]
    exercises = sorted({r.exercise for r in totals})
    maximum = {e: max(r.max_points for r in totals if r.exercise == e) for e in exercises}
    points: dict[str, dict[str, int]] = {e.student: {} for e in roster or []}
    for r in totals:
        best = points.setdefault(r.student, {})
        best[r.exercise] = max(best.get(r.exercise, 0), r.points)
    return exercises, maximum, {s: {e: p.get(e, 0) for e in exercises} for s, p in points.items()}


def _lms_ids(rows: Iterable) -> dict[str, str]:
    return {r.student: r.lms_id for r in rows if getattr(r, "lms_id", "")}


def _canvas(rows: list, roster: dict[str, RosterEntry]) -> list[list[object]]:
    exercises, maximum, points = student_totals(rows, list(roster.values()) or None)
    ids = _lms_ids(rows)
    table: list[list[object]] = [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *exercises, "servelab total"],
        [
            "Points Possible",
            "",
            "",
            "",
            "",
            *(maximum[e] for e in exercises),
            sum(maximum.values()),
        ],
    ]
    for student in sorted(points):
        entry = roster.get(student, RosterEntry(student))
        marks = [points[student][e] for e in exercises]
        table.append(
            [
                entry.get("name") or student,
                entry.get("id") or ids.get(student, ""),
                entry.get("sis_user_id"),
                entry.get("sis_login_id"),
                entry.get("section"),
                *marks,
                sum(marks),
            ]
        )
    return table


def _moodle(rows: list, roster: dict[str, RosterEntry]) -> list[list[object]]:
    exercises, _, points = student_totals(rows, list(roster.values()) or None)
    ids = _lms_ids(rows)
    table: list[list[object]] = [["First name", "Last name", "ID number", "Email address",
                                  *(f"{e} (Real)" for e in exercises), "Total (Real)"]]
    for student in sorted(points):
        entry = roster.get(student, RosterEntry(student))
        first, last = entry.get("first_name"), entry.get("last_name")
        if not (first or last):
            first, _, last = student.partition(" ")
        marks = [points[student][e] for e in exercises]
        table.append(
            [
                first,
                last,
                entry.get("id_number") or ids.get(student, ""),
                entry.get("email"),
                *marks,
                sum(marks),
            ]
        )
    return table


def _long(rows: list) -> list[list[object]]:
    return [
        list(LONG_COLUMNS),
        *([r.student, r.exercise, r.case, r.points, r.max_points, r.note, r.path] for r in rows),
    ]


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def write_sheet(
    rows: list, out: str | Path, fmt: str = "long", roster: list[RosterEntry] | None = None
) -> Path:
    """Write the grade sheet in ``fmt`` (one of :data:`FORMATS`), atomically; returns the path."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {list(FORMATS)}, got {fmt!r}")
    by_name = {e.student: e for e in roster or []}
    table = (
        _long(rows)
        if fmt == "long"
        else _canvas(rows, by_name)
        if fmt == "canvas"
        else _moodle(rows, by_name)
    )
    text = io.StringIO()
    csv.writer(text).writerows(table)
    return write_atomic(out, text.getvalue())


def _file_name(student: str) -> str:
    return (re.sub(r"[^A-Za-z0-9._-]+", "_", student).strip("._") or "student") + ".md"


def _feedback_text(student: str, rows: list) -> str:
    lines = [f"# Feedback for {student}", ""]
    if not rows:
        return "\n".join(
            [*lines, "No exercise notebook of yours was found in this submission: 0 points.", ""]
        )
    for total in (r for r in rows if r.case == "TOTAL"):
        cases = [r for r in rows if r.path == total.path and r.case != "TOTAL"]
        lines += [f"## {total.exercise}: {total.points} / {total.max_points} points", "",
                  f"Graded file: `{Path(total.path).name}`", ""]
        if total.note:
            lines += [f"Running the notebook: {total.note}", ""]
        failed = [r for r in cases if r.points < r.max_points]
        if not failed:
            lines += ["Every hidden case passed.", ""]
        for r in failed:
            lines += [
                f"### Rule: {r.case} ({r.points} / {r.max_points})",
                "",
                "```text",
                r.note,
                "```",
                "",
            ]
    return "\n".join(lines)


def write_feedback(
    rows: list, folder: str | Path, roster: list[RosterEntry] | None = None
) -> list[Path]:
    """One Markdown file per student (and per roster student): every failed case's rule, the inputs
    the grader sent, what the student's code returned and the steps; hidden expected values never
    appear."""
    students = sorted({r.student for r in rows} | {e.student for e in roster or []})
    return [
        write_atomic(
            Path(folder) / _file_name(s), _feedback_text(s, [r for r in rows if r.student == s])
        )
        for s in students
    ]
