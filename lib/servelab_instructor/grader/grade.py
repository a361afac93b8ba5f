"""Batch grading: call each student's code in an isolated worker, judge it in the grader.

For one notebook (:func:`grade_notebook`): the cells' definitions (see :mod:`.extract`) run in a
worker process (see :mod:`.sandbox`) that starts in a fresh empty folder, with CPU-time, memory and
output limits per case, and refuses every ``servelab`` import its exercise does not allow. The
exercise's checkers then run **here**, on the *hidden* cases generated from the instructor's secret
seed, calling the student's functions and classes through proxies: the inputs go to the worker and
the student's answers come back as plain data, so the expected values, the checkers and the grade
sheet never exist where the student's code runs. The hidden cases' expected values come from the
instructor-only reference solutions (:func:`.expected.reference`): without them grading stops at
once with a :class:`.expected.MissingReference` naming how to get them. A case's note names the
rule's input and what the student returned (or the refused import, the time limit, the crash), never
a hidden expected value.

For a folder (:func:`grade_submissions`): see :mod:`.submissions` for the names accepted; notebooks
are graded ``jobs`` at a time, inside :func:`.reaper.reaping`, so every process a submission started
is killed before the grade sheet is written (atomically, by :mod:`.lms`).

System boundary: the worker runs inside the isolation :func:`.isolation.choose` finds (bubblewrap's
namespaces, or a uid of its own), or nowhere: without either the grader refuses to start unless
asked to run unprotected. Each submission is read once, before any student code runs (its bytes and
the SHA-256 of every file under the folder); workers get the extracted statements through their pipe
and never see the submissions folder. After grading the hashes are checked again and every file that
changed is reported (:attr:`GradeRun.changed`). An exercise whose code tried something the sandbox
refuses (a process, a signal, a socket, a file outside its scratch folder, the reply pipe) scores 0,
with a note naming it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import nbformat

from servelab._validate import require_int
from servelab_instructor.grader import sandbox
from servelab.exercises.catalog import EXERCISES, Exercise, exercise_for
from servelab.exercises.expected import reference
from servelab_instructor.grader.extract import graded_statements
from servelab_instructor.grader.isolation import Isolation, choose
from servelab_instructor.grader.reaper import reaping, sweep
from servelab.exercises.result import CheckResult, observing_cases
from servelab_instructor.grader.sandbox import CaseLog, Limits, RemoteClass, RemoteFunction, Worker
from servelab_instructor.grader.submissions import (
    Skipped,
    Submission,
    changed_files,
    find_submissions,
    snapshot,
)
from servelab.prose import count

__all__ = ["CaseGrade", "GradeRun", "Limits", "grade_notebook", "grade_submissions"]

_MAX_LOG_LINES = 12


@dataclass(frozen=True)
class CaseGrade:
    """One row of the grade sheet; ``case`` is ``"TOTAL"`` on an exercise's total row."""

    student: str
    exercise: str
    case: str
    points: int
    max_points: int
    note: str = ""
    path: str = ""
    lms_id: str = ""


@dataclass(frozen=True)
class GradeRun:
    """Everything a batch produced: the rows (cases and totals), every file skipped with its reason,
    every file under the folder that changed while grading (``"path: how"``), and the isolation
    used."""

    rows: list[CaseGrade]
    skipped: list[Skipped]
    changed: list[str] = field(default_factory=list)
    isolation: str = ""


def _not_implemented(*args: object, **kwargs: object) -> None:
    raise NotImplementedError


def _zero_rows(exercise: Exercise, checks: tuple, note: str, seed: int) -> list[CaseGrade]:
    """Every case of ``checks`` at 0 points (their names and points come from a run on stubs)."""
    rows = []
    for check, names in checks:
        result = check(*[_not_implemented] * len(names), verbose=False, seed=seed)
        rows += [CaseGrade("", exercise.stem, c.name, 0, c.max_points, note) for c in result.cases]
    return rows


def _collapsed(calls: list[str]) -> list[str]:
    """Consecutive identical lines as one, with how many times it happened."""
    out: list[tuple[str, int]] = []
    for line in calls:
        if out and out[-1][0] == line:
            out[-1] = (line, out[-1][1] + 1)
        else:
            out.append((line, 1))
    return [line if times == 1 else f"{line} ({times} identical calls)" for line, times in out]


def _note(log: CaseLog, detail: str, feedback: str = "") -> str:
    """A failed case's note: the refused operation, the limit, then the checker's feedback (the rule
    broken, the input and what came back, never the expected value) or else the calls made and what
    they returned, identical calls collapsed."""
    head = []
    if log.denied:
        head.append(f"refused: {'; '.join(dict.fromkeys(log.denied))}")
    if log.refused:
        head.append(f"refused import: {', '.join(dict.fromkeys(log.refused))}")
    if log.timed_out:
        head.append("stopped at the case's time limit")
    if log.output_limit:
        head.append("printed more than the output limit")
    if detail == "not implemented yet":
        head.append(detail)
    if feedback:
        return "\n".join([*head, feedback])
    lines = _collapsed(log.calls)
    calls = lines[-_MAX_LOG_LINES:]
    skipped = len(lines) - len(calls)
    steps = [f"... {count(skipped, 'earlier line')}"] if skipped else []
    return "\n".join([*head, *steps, *calls]) or "the answer differs from the hidden case's"


def _run_check(worker: Worker, check: object, names: tuple[str, ...], kinds: dict, seed: int,
               exercise: Exercise) -> list[CaseGrade]:
    """Run one checker here on proxies of the student's names; one row per case."""
    proxies = [
        RemoteClass(worker, n) if kinds[n] == "class" else RemoteFunction(worker, n) for n in names
    ]
    logs: list[CaseLog] = []

    def start(rule: str) -> None:
        worker.start_case(rule)
        logs.append(worker.log)

    with observing_cases(start):
        result: CheckResult = check(*proxies, verbose=False, seed=seed)
    logs += [CaseLog()] * (len(result.cases) - len(logs))
    return [CaseGrade("", exercise.stem, c.name, c.points, c.max_points,
                      "" if c.passed and not log.refused else _note(log, c.detail, c.feedback))
            for c, log in zip(result.cases, logs)]


def _refusal_zeroes(rows: list[CaseGrade], denied: list[str]) -> list[CaseGrade]:
    """A case whose calls used a refused import scores 0, even if the student caught the
    ImportError; when the sandbox refused anything (``denied``), every case of the exercise does,
    each note naming it."""
    if denied:
        refused = f"refused: {'; '.join(dict.fromkeys(denied))}"
        return [replace(r, points=0, note=r.note if r.note.startswith(refused) else
                        "\n".join(filter(None, [refused, r.note]))) for r in rows]
    return [replace(r, points=0) if r.note.startswith("refused import") else r for r in rows]


def grade_notebook(path: str | Path, student: str, seed: int, limits: Limits = Limits(),
                   lms_id: str = "", stem: str | None = None, isolation: Isolation | None = None,
                   content: bytes | None = None) -> list[CaseGrade]:
    """Grade one notebook on the hidden cases of ``seed``: one row per case plus the exercise's
    TOTAL row.

    ``stem`` names the exercise (default: the exercise stem found in the file name); ``content`` is
    the notebook's bytes as read before grading began (default: read ``path`` now); ``isolation``
    defaults to :func:`.isolation.choose` (IsolationUnavailable when there is none).
    """
    path = Path(path)
    require_int("seed", seed, 0)
    reference()  # MissingReference before any student code runs
    isolation = isolation or choose()
    exercise = exercise_for(
        stem or next((s for s in EXERCISES if s in path.name), path.stem.split("__")[-1])
    )
    names = tuple(n for _, ns in exercise.checks for n in ns)
    crash = ""
    try:
        text = (path.read_bytes() if content is None else content).decode("utf-8")
        statements, problems = graded_statements(nbformat.reads(text, as_version=4), names)
    except Exception as exc:  # an unreadable notebook scores 0, the batch goes on
        statements, problems = [], [f"the notebook could not be read: {type(exc).__name__}: {exc}"]
    worker = Worker(statements, exercise.allowed, limits, isolation)
    try:
        loaded = worker.load() if statements else {"kinds": {}, "errors": [], "refused": []}
        kinds, refused = loaded["kinds"], loaded["refused"]
        crash = "; ".join([*problems, *loaded["errors"]][:3])
        rows: list[CaseGrade] = []
        for check, check_names in exercise.checks:
            missing = [n for n in check_names if kinds.get(n) not in ("class", "function")]
            if missing or refused:
                note = "; ".join([*([f"refused import: {', '.join(refused)}"] if refused else []),
                                  *([f"not defined: {', '.join(missing)}"] if missing else []),
                                  *([crash] if crash else [])])
                rows += _zero_rows(exercise, ((check, check_names),), note, seed)
            else:
                rows += _run_check(worker, check, check_names, kinds, seed, exercise)
    finally:
        worker.close()
    rows = [replace(r, student=student, path=str(path), lms_id=lms_id)
            for r in _refusal_zeroes(rows, worker.denied)]
    if worker.denied:
        crash = "\n".join(
            filter(None, [f"refused: {'; '.join(dict.fromkeys(worker.denied))}", crash])
        )
    total = CaseGrade(student, exercise.stem, "TOTAL", sum(r.points for r in rows),
                      sum(r.max_points for r in rows), crash, str(path), lms_id)
    return [*rows, total]


def grade_submissions(folder: str | Path, seed: int, limits: Limits = Limits(), jobs: int = 1,
                      isolation: Isolation | None = None) -> GradeRun:
    """Grade every submission under ``folder``, ``jobs`` notebooks at a time; ValueError when there
    is none.

    Every file under ``folder`` is read and hashed before the first worker starts; the notebooks are
    graded from those bytes. Returns once every process any submission started is gone, with every
    file that changed since. ``isolation`` defaults to :func:`.isolation.choose`.
    """
    require_int("jobs", jobs, 1)
    require_int("seed", seed, 0)
    reference()  # MissingReference before any student code runs
    isolation = isolation or choose()
    found, skipped = find_submissions(folder)
    if not found:
        raise ValueError(f"no exercise notebook ({', '.join(sorted(EXERCISES))}) under {folder}")
    before_grading = snapshot(folder)
    with reaping() as before:
        def one(sub: Submission) -> list[CaseGrade]:
            rows = grade_notebook(
                sub.path,
                sub.student,
                seed,
                limits,
                sub.lms_id,
                sub.stem,
                isolation,
                before_grading.contents[sub.path],
            )
            with sandbox.SPAWN_LOCK:
                sweep(before | sandbox.LIVE)
            return rows

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            graded = list(pool.map(one, found))
    return GradeRun(
        [row for rows in graded for row in rows],
        skipped,
        changed_files(before_grading, folder),
        isolation.describe(),
    )
