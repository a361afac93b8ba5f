"""Find the exercise notebooks in a folder of submissions, whoever named them, and say what was
skipped.

Accepted layouts (the student's name is the grade sheet's ``student`` column):

* a folder per student: ``alice/ex03-block-allocator.ipynb``; a Moodle bulk download's folders
  ``Alice Smith_12345_assignsubmission_file_/…`` count for ``Alice Smith`` (id ``12345``);
* a notebook directly in the folder named ``STUDENT__STEM…``: ``bob__ex07-kv-sizing (1).ipynb``;
* a Canvas bulk download's names ``NAME[_LATE]_USERID_SUBMISSIONID_FILE``:
  ``smithjohn_12345_67890_ex05-goodput.ipynb`` counts for ``smithjohn`` (id ``12345``).

The exercise is the first exercise stem found in the file name (``ex05-goodput``,
``ex05-goodput-2``, ``ex05-goodput (1)``), or else its number (``ex05…``). Every other file is
skipped with its reason.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from servelab.exercises.catalog import EXERCISES

__all__ = [
    "Skipped",
    "Snapshot",
    "Submission",
    "changed_files",
    "exercise_in_name",
    "find_submissions",
    "snapshot",
]

_CANVAS = re.compile(r"^(?P<student>[^_]+?)(?:_LATE)?_(?P<id>\d+)_(?P<sub>\d+)_(?P<file>.+)$")
_MOODLE = re.compile(r"^(?P<student>.+?)_(?P<id>\d+)_assignsubmission_")
_NUMBER = re.compile(r"ex(\d{2})")


@dataclass(frozen=True)
class Submission:
    """One notebook to grade: who, which exercise (its stem), where, and the LMS id when the name
    had one."""

    student: str
    stem: str
    path: Path
    lms_id: str = ""


@dataclass(frozen=True)
class Skipped:
    """A file that is not graded, and why."""

    path: Path
    reason: str


def exercise_in_name(name: str) -> str | None:
    """The exercise stem a file name holds (``ex05-goodput (1).ipynb``), else by number (``ex05…``),
    or None."""
    lower = name.lower()
    for stem in EXERCISES:
        if stem in lower:
            return stem
    match = _NUMBER.search(lower)
    by_number = [s for s in EXERCISES if match and s.startswith(f"ex{match.group(1)}-")]
    return by_number[0] if by_number else None


def _owner(path: Path, folder: Path) -> tuple[str, str, str] | str:
    """``(student, lms_id, file part)`` of a notebook, or the reason it has no student."""
    if path.parent != folder:
        top = path.relative_to(folder).parts[0]
        moodle = _MOODLE.match(top)
        return (moodle["student"], moodle["id"], path.name) if moodle else (top, "", path.name)
    canvas = _CANVAS.match(path.name)
    if canvas:
        return canvas["student"], canvas["id"], canvas["file"]
    if "__" in path.name:
        student, rest = path.name.split("__", 1)
        return student, "", rest
    return ("no student name: put the notebook in a folder named after the student, or name it "
            "STUDENT__ex05-goodput.ipynb")


def _classify(path: Path, folder: Path) -> Submission | Skipped:
    if ".ipynb_checkpoints" in path.parts:
        return Skipped(path, "a Jupyter checkpoint copy")
    if path.suffix != ".ipynb":
        return Skipped(path, "not a notebook (.ipynb)")
    owner = _owner(path, folder)
    if isinstance(owner, str):
        return Skipped(path, owner)
    student, lms_id, file_part = owner
    stem = exercise_in_name(file_part)
    if stem is None:
        return Skipped(path, f"no exercise in its name (one of {', '.join(sorted(EXERCISES))})")
    return Submission(student.strip(), stem, path, lms_id)


def find_submissions(folder: str | Path) -> tuple[list[Submission], list[Skipped]]:
    """Every gradable notebook under ``folder`` (sorted by student, exercise, path) and every
    skipped file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"submissions must be a folder, got {str(folder)!r}")
    found: list[Submission] = []
    skipped: list[Skipped] = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        item = _classify(path, folder)
        (found if isinstance(item, Submission) else skipped).append(item)
    found.sort(key=lambda s: (s.student, s.stem, str(s.path)))
    return found, skipped


@dataclass(frozen=True)
class Snapshot:
    """Every file under a submissions folder as read before grading: notebook bytes and SHA-256
    hashes."""

    contents: dict[Path, bytes]
    hashes: dict[Path, str]


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def snapshot(folder: str | Path) -> Snapshot:
    """Read every file under ``folder`` once: the notebooks' bytes, and every file's SHA-256."""
    contents: dict[Path, bytes] = {}
    hashes: dict[Path, str] = {}
    for path in _files(Path(folder)):
        data = path.read_bytes()
        hashes[path] = hashlib.sha256(data).hexdigest()
        if path.suffix == ".ipynb":
            contents[path] = data
    return Snapshot(contents, hashes)


def changed_files(before: Snapshot, folder: str | Path) -> list[str]:
    """Each file under ``folder`` that differs from ``before``: ``"path:
    changed|deleted|added"``."""
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in _files(Path(folder))}
    changed = [f"{p}: deleted" if p not in after else f"{p}: changed" for p in before.hashes
               if after.get(p) != before.hashes[p]]
    return sorted([*changed, *(f"{p}: added" for p in after if p not in before.hashes)])
