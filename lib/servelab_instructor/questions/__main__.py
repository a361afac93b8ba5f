"""Command line for instructors: ``python -m servelab_instructor.questions export ...``.

Examples::

    python -m servelab_instructor.questions export --tiers L1,L2 --out hw1
    python -m servelab_instructor.questions export --questions Q1,Q9 --format notebook --out quiz
    python -m servelab_instructor.questions export --tiers L1 --set pipeline --format markdown --out drill

    python -m servelab_instructor.questions export --tiers L1 --out week1 --key-out week1-key

Writes ``assignment.*`` (student version, no answers) into ``--out`` and ``answer-key.*`` into
``--key-out`` (default ``--out``).
"""

from __future__ import annotations

import argparse
import sys

from servelab.questions.bank import load_bank
from servelab_instructor.questions.export import FORMATS, export_assignment


def _csv(value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list, got an empty value")
    return items


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m servelab_instructor.questions", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="write a student assignment and its answer key")
    pick = export.add_mutually_exclusive_group(required=True)
    pick.add_argument("--tiers", type=_csv, help="comma-separated tiers, e.g. L1,L2")
    pick.add_argument("--questions", type=_csv, help="comma-separated question ids, e.g. Q1,Q9,P3")
    export.add_argument(
        "--set",
        default="core",
        help="question set for --tiers: core, pipeline or all (default core)",
    )
    export.add_argument(
        "--format", type=_csv, default=list(FORMATS), help="notebook and/or markdown (default both)"
    )
    export.add_argument(
        "--out", required=True, help="folder of the student version (created if missing)"
    )
    export.add_argument(
        "--key-out",
        help="folder of the answer key (default --out; a folder of its own keeps "
        "the key out of what you hand out)",
    )
    export.add_argument("--title", default="servelab interview questions", help="assignment title")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    args = _parser().parse_args(argv)
    bank = load_bank()
    try:
        if args.questions is not None:
            questions = bank.select(ids=args.questions)
        else:
            questions = bank.select(
                tiers=args.tiers, set_id=None if args.set == "all" else args.set
            )
        if not questions:
            raise ValueError(f"no question matches --tiers {args.tiers} in --set {args.set}")
        paths = export_assignment(questions, args.out, formats=args.format, title=args.title,
                                  key_dir=args.key_out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(questions)} questions: {', '.join(q.id for q in questions)}")
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
