"""The Gradescope autograder: build ``autograder.zip``, and grade one submission inside it.

``python -m servelab_instructor.gradescope build --out autograder.zip --seed N [--exercise STEM
...]`` writes a zip with, at its root (Gradescope's autograder specification):

* ``setup.sh`` -- run once as root on Gradescope's Ubuntu image: installs bubblewrap and a Python
  venv with the course's pinned ``requirements.txt`` and the ``servelab`` package (from
  ``course/``);
* ``run_autograder`` -- run per submission: grades the notebooks under
  ``$AUTOGRADER_ROOT/submission`` (default ``/autograder``) on the hidden cases of the seed baked
  into ``grading.json``, and writes ``$AUTOGRADER_ROOT/results/results.json``;
* ``course/`` (the package's source), ``instructor/`` (this package, for the reference solutions),
  ``requirements.txt`` and ``grading.json`` (the seed, the exercises, the limits).

Grading (``run --root ROOT``) uses the batch grader's worker and isolation
(:mod:`servelab_instructor.grader.isolation`): student code never sees ``results/``, the zip's files
or the seed. ``results.json`` has one test per rule (``name``, ``score``, ``max_score``, ``output``,
``visibility``: ``after_published``, since every case is a hidden one) and a top-level ``score``
equal to their sum; it is written last, atomically (a temporary file renamed over it). If anything
under ``results/`` changed while student code ran, every test scores 0 with a note saying so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from servelab.exercises.catalog import EXERCISES
from servelab_instructor.grader.grade import CaseGrade, grade_notebook
from servelab_instructor.grader.isolation import IsolationUnavailable, choose
from servelab_instructor.grader.reaper import hide_process_state, reaping
from servelab_instructor.grader.sandbox import Limits
from servelab_instructor.grader.submissions import exercise_in_name

__all__ = ["HIDDEN", "build", "main", "results", "run"]

HIDDEN = "after_published"  # hidden cases: shown to the student once the grades are published
_ROOT = Path(__file__).resolve().parents[2]  # the course checkout (lib/ is one level down)
_CONFIG = "grading.json"
SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu).
set -euo pipefail
SOURCE=/autograder/source
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq bubblewrap python3 python3-venv python3-pip >/dev/null
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install -q --upgrade pip
/autograder/venv/bin/pip install -q -r "$SOURCE/requirements.txt"
/autograder/venv/bin/pip install -q --no-deps "$SOURCE/course"
chmod -R go-rwx "$SOURCE"   # the seed and the reference solutions: root only, never a worker's uid
chmod 0755 /autograder /autograder/venv
"""
RUN = """#!/usr/bin/env bash
# Gradescope runs this per submission (as root, working folder /autograder). Locally:
# AUTOGRADER_ROOT=path/to/root SERVELAB_AUTOGRADER_PYTHON=python bash path/to/root/run_autograder
set -uo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PYTHON="${SERVELAB_AUTOGRADER_PYTHON:-/autograder/venv/bin/python}"
mkdir -p "$ROOT/results"
PYTHONPATH="$ROOT/source/instructor" exec "$PYTHON" -m servelab_instructor.gradescope run --root "$ROOT"
"""


def _course_files() -> list[tuple[Path, str]]:
    """(file, name in the zip) for the package's source and this instructor package."""
    files = [(_ROOT / name, f"course/{name}") for name in ("pyproject.toml", "README.md")]
    for package, prefix in (("servelab", "course/lib/"), ("servelab_instructor", "instructor/")):
        for path in sorted((_ROOT / "lib" / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files.append((path, prefix + str(path.relative_to(_ROOT / "lib"))))
    return files


def _add(archive: zipfile.ZipFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def build(
    out: str | Path, seed: int, exercises: list[str] | None = None, limits: Limits = Limits()
) -> Path:
    """Write the autograder zip to ``out`` for the hidden cases of ``seed``; returns its path.

    ``exercises`` (stems) are the notebooks every submission is expected to hold (default: all).
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    stems = list(exercises or EXERCISES)
    unknown = [s for s in stems if s not in EXERCISES]
    if unknown:
        raise ValueError(f"exercises must be among {sorted(EXERCISES)}, got {unknown}")
    config = {
        "seed": seed,
        "exercises": stems,
        "case_seconds": limits.case_seconds,
        "load_seconds": limits.load_seconds,
        "memory_mib": limits.memory_mib,
        "output_kib": limits.output_kib,
    }
    out = Path(out)
    with zipfile.ZipFile(out, "w") as archive:
        _add(archive, "setup.sh", SETUP.encode(), 0o755)
        _add(archive, "run_autograder", RUN.encode(), 0o755)
        _add(archive, "requirements.txt", (_ROOT / "requirements.txt").read_bytes())
        _add(archive, _CONFIG, json.dumps(config, indent=1).encode(), 0o600)
        for path, name in _course_files():
            _add(archive, name, path.read_bytes())
    return out


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its SHA-256 (empty when the folder does not exist)."""
    if not folder.is_dir():
        return {}
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _notebooks(submission: Path) -> dict[str, tuple[Path, bytes]]:
    """The first notebook (by path) for each exercise found under ``submission``, with its bytes."""
    found: dict[str, tuple[Path, bytes]] = {}
    for path in sorted(submission.rglob("*.ipynb")) if submission.is_dir() else ():
        stem = exercise_in_name(path.name)
        if stem and stem not in found and ".ipynb_checkpoints" not in path.parts:
            found[stem] = (path, path.read_bytes())
    return found


def results(rows: list[CaseGrade], output: str, elapsed: float) -> dict:
    """Gradescope's results.json: one test per rule, the top-level score their sum."""
    tests = [
        {
            "name": f"{r.exercise}: {r.case}",
            "score": r.points,
            "max_score": r.max_points,
            "status": "passed" if r.points == r.max_points else "failed",
            "output": r.note or "passed",
            "visibility": HIDDEN,
        }
        for r in rows
        if r.case != "TOTAL"
    ]
    return {
        "score": sum(t["score"] for t in tests),
        "execution_time": round(elapsed, 1),
        "output": output,
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def _write_atomically(path: Path, data: dict) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".results-", suffix=".json")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _missing_rows(stem: str, seed: int) -> list[CaseGrade]:
    """Every case of an exercise with no notebook in the submission, at 0 points."""
    exercise = EXERCISES[stem]

    def stub(*args: object) -> None:
        raise NotImplementedError

    rows = []
    for check, names in exercise.checks:
        for case in check(*[stub] * len(names), verbose=False, seed=seed).cases:
            rows.append(CaseGrade("", stem, case.name, 0, case.max_points,
                                  f"no {stem}.ipynb in the submission"))
    return rows


def run(root: str | Path) -> dict:
    """Grade ``root/submission`` with ``root/source/grading.json``; write and return
    results.json."""
    started = time.monotonic()
    root = Path(root)
    config = json.loads((root / "source" / _CONFIG).read_text(encoding="utf-8"))
    limits = Limits(
        config["case_seconds"], config["memory_mib"], config["output_kib"], config["load_seconds"]
    )
    results_dir = root / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    isolation = choose()
    notebooks = _notebooks(root / "submission")
    before, submission_before = _tree(results_dir), _tree(root / "submission")
    rows: list[CaseGrade] = []
    with reaping():
        for stem in config["exercises"]:
            if stem not in notebooks:
                rows += _missing_rows(stem, config["seed"])
                continue
            path, content = notebooks[stem]
            rows += grade_notebook(
                path,
                "submission",
                config["seed"],
                limits,
                stem=stem,
                isolation=isolation,
                content=content,
            )
    notes = [isolation.describe()]
    if _tree(results_dir) != before:
        note = (
            "refused: the submission wrote into results/ while it was graded; every test scores 0"
        )
        rows = [
            CaseGrade(
                r.student,
                r.exercise,
                r.case,
                0,
                r.max_points,
                "\n".join(filter(None, [note, r.note])),
            )
            for r in rows
        ]
        notes.append(note)
    if _tree(root / "submission") != submission_before:
        notes.append("warning: a submission file changed while it was graded")
    data = results(rows, "\n".join(notes), time.monotonic() - started)
    _write_atomically(results_dir / "results.json", data)
    return data


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m servelab_instructor.gradescope",
                                     description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="write autograder.zip for Gradescope")
    make.add_argument(
        "--out", default="autograder.zip", help="zip to write (default autograder.zip)"
    )
    make.add_argument(
        "--seed", type=int, help="secret seed of the hidden cases (default: $SERVELAB_GRADE_SEED)"
    )
    make.add_argument(
        "--exercise",
        action="append",
        choices=sorted(EXERCISES),
        help="an exercise each submission holds (repeatable; default: every exercise)",
    )
    make.add_argument(
        "--case-time", type=float, default=Limits.case_seconds, help="seconds per hidden case"
    )
    grade = commands.add_parser("run", help="grade ROOT/submission into ROOT/results/results.json")
    grade.add_argument("--root", default=os.environ.get("AUTOGRADER_ROOT", "/autograder"))
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            seed = args.seed
            if seed is None:
                value = os.environ.get("SERVELAB_GRADE_SEED", "").strip()
                if not value.isdigit():
                    raise ValueError(
                        "give the hidden cases' secret seed with --seed N or $SERVELAB_GRADE_SEED"
                    )
                seed = int(value)
            if args.case_time <= 0:
                raise ValueError(f"--case-time must be > 0, got {args.case_time}")
            limits = Limits(case_seconds=args.case_time)
            print(f"wrote {build(args.out, seed, args.exercise, limits)}")
            return 0
        hide_process_state()
        data = run(args.root)
    except (ValueError, OSError, IsolationUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"score {data['score']} of {sum(t['max_score'] for t in data['tests'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
