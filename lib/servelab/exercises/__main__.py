"""Command line for instructors: ``python -m servelab.exercises grade SUBMISSIONS_DIR --out grades.csv``.

Executes every student's exercise notebooks (see :mod:`servelab.exercises.grade` for the folder
layout), prints each student's total per exercise and writes one CSV row per case and per exercise
total: ``student, exercise, case, points, max_points, note``.
"""

from __future__ import annotations

import argparse
import sys

from servelab.exercises.grade import grade_submissions, write_grades


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m servelab.exercises", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    grade = commands.add_parser("grade", help="execute submitted notebooks and write the grade sheet")
    grade.add_argument("submissions", help="folder of submissions: one sub-folder per student")
    grade.add_argument("--out", default="grades.csv", help="CSV to write (default grades.csv)")
    grade.add_argument("--time-limit", type=float, default=120.0,
                       help="seconds each notebook may run before it scores 0 (default 120)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    args = _parser().parse_args(argv)
    try:
        rows = grade_submissions(args.submissions, time_limit=args.time_limit)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for row in rows:
        if row.case == "TOTAL":
            note = f"  ({row.note})" if row.note else ""
            print(f"{row.student:<16} {row.exercise:<24} {row.points:>3} / {row.max_points}{note}")
    print(f"wrote {write_grades(rows, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
