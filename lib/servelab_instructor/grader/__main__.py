"""Command line for instructors: ``python -m servelab_instructor.grader grade SUBMISSIONS_DIR --out
grades.csv``.

Grades every student's exercise notebooks on hidden cases drawn from a secret seed (``--seed`` or
the ``SERVELAB_GRADE_SEED`` environment variable; prefer the variable: a command line is visible to
every process on the machine), prints each student's total per exercise and every skipped file with
its reason, and writes the sheet in ``--format long|canvas|moodle`` (see
:mod:`servelab_instructor.grader.lms`), plus one Markdown feedback file per student with
``--feedback DIR``. The hidden cases need the instructor-only reference solutions
(``servelab_instructor``, in the course repository's ``lib/``, not in the wheel); without them it
prints what is missing and how to get it, and exits with status 2.

Student code runs isolated (:mod:`servelab_instructor.grader.isolation`: bubblewrap, else a uid of
its own when run as root); the first line printed names the isolation. Where neither exists it
refuses with status 2, unless ``--unsafe`` is given, which prints the risk and grades unprotected.
Every file under the submissions folder that changed during grading is printed as a warning.
"""

from __future__ import annotations

import argparse
import os
import sys

from servelab.exercises.expected import MissingReference
from servelab_instructor.grader.grade import grade_submissions
from servelab_instructor.grader.isolation import IsolationUnavailable, choose
from servelab_instructor.grader.lms import FORMATS, read_roster, write_feedback, write_sheet
from servelab_instructor.grader.reaper import hide_process_state
from servelab_instructor.grader.sandbox import Limits

SEED_VARIABLE = "SERVELAB_GRADE_SEED"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m servelab_instructor.grader", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    grade = commands.add_parser(
        "grade", help="grade submitted notebooks on hidden cases and write the sheet"
    )
    grade.add_argument(
        "submissions", help="folder of submissions (a folder per student, or LMS download names)"
    )
    grade.add_argument("--out", default="grades.csv", help="CSV to write (default grades.csv)")
    grade.add_argument(
        "--format", choices=FORMATS, default="long", help="sheet layout (default long)"
    )
    grade.add_argument(
        "--seed", type=int, help=f"secret seed of the hidden cases (default: ${SEED_VARIABLE})"
    )
    grade.add_argument(
        "--roster", help="CSV with a 'student' column: everyone on it gets a row, 0 if missing"
    )
    grade.add_argument(
        "--feedback", metavar="DIR", help="write one Markdown feedback file per student here"
    )
    grade.add_argument("--jobs", type=int, default=1, help="notebooks graded at once (default 1)")
    grade.add_argument(
        "--case-time",
        type=float,
        default=Limits.case_seconds,
        help=f"seconds (wall and CPU) each hidden case may take (default {Limits.case_seconds:g})",
    )
    grade.add_argument(
        "--time-limit",
        type=float,
        default=Limits.load_seconds,
        help=f"seconds a notebook's definitions may take to run (default {Limits.load_seconds:g})",
    )
    grade.add_argument("--memory", type=int, default=Limits.memory_mib,
                       help=f"MiB of address space per worker (default {Limits.memory_mib})")
    grade.add_argument("--output-limit", type=int, default=Limits.output_kib,
                       help=f"KiB a case may print (default {Limits.output_kib})")
    grade.add_argument(
        "--unsafe",
        action="store_true",
        help="grade even without isolation (neither bubblewrap nor root): student code then "
        "runs with your rights and can kill the grader or rewrite other submissions",
    )
    return parser


def _seed(given: int | None) -> int:
    if given is not None:
        return given
    value = os.environ.get(SEED_VARIABLE, "").strip()
    if not value:
        raise ValueError(f"give the hidden cases' secret seed with --seed N or ${SEED_VARIABLE}")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{SEED_VARIABLE} must be an integer >= 0, got {value!r}") from None


def _limits(args: argparse.Namespace) -> Limits:
    for name, value in (("--case-time", args.case_time), ("--time-limit", args.time_limit),
                        ("--memory", args.memory), ("--output-limit", args.output_limit)):
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    return Limits(args.case_time, args.memory, args.output_limit, args.time_limit)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    args = _parser().parse_args(argv)
    hide_process_state()  # the seed in this process's environment is not readable by submissions
    try:
        seed, limits = _seed(args.seed), _limits(args)
        roster = read_roster(args.roster) if args.roster else None
        isolation = choose(args.unsafe)
        print(isolation.describe(), file=sys.stderr if args.unsafe else sys.stdout)
        run = grade_submissions(args.submissions, seed, limits, args.jobs, isolation)
    except (ValueError, OSError, MissingReference, IsolationUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for row in run.rows:
        if row.case == "TOTAL":
            note = f"  ({row.note.splitlines()[0]})" if row.note else ""
            print(f"{row.student:<16} {row.exercise:<24} {row.points:>3} / {row.max_points}{note}")
    for skipped in run.skipped:
        print(f"skipped {skipped.path}: {skipped.reason}")
    for changed in run.changed:
        print(f"warning: a submission file changed during grading: {changed}")
    if roster:
        graded = {r.student for r in run.rows}
        for student in sorted(graded - {e.student for e in roster}):
            print(f"warning: {student} submitted but is not on the roster")
        for entry in roster:
            if entry.student not in graded:
                print(f"missing: {entry.student} (0 points)")
    print(f"wrote {write_sheet(run.rows, args.out, args.format, roster)}")
    if args.feedback:
        print(
            f"wrote {len(write_feedback(run.rows, args.feedback, roster))} feedback files "
            f"to {args.feedback}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
