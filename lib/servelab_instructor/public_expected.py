"""Write the public cases' expected values, computed by the reference, into the student package.

The exercise notebooks' checkers run their public cases without the reference solutions: the
expected values come from ``servelab/exercises/public_expected.json``
(:mod:`servelab.exercises.expected`). This module regenerates that file from
:mod:`servelab_instructor.reference`::

    PYTHONPATH=lib python -m servelab_instructor.public_expected          # rewrite the file
    PYTHONPATH=lib python -m servelab_instructor.public_expected --check  # exit 1 if it has drifted

(``PYTHONPATH=lib`` is not needed after ``make setup``.) ``tests/test_exercise_reference.py`` fails
when the committed file differs from what the reference computes now.
"""

from __future__ import annotations

import argparse
import json
import sys

from servelab.exercises import admission, kv, sizing, speculative
from servelab.exercises.expected import EXPECTED_FILE

__all__ = ["expected_values", "main", "render"]


def expected_values() -> dict[str, object]:
    """Every checker's public expected values, as the reference computes them now."""
    return {
        "admission": admission.expected_from_reference(admission.ADMISSION_CASES),
        "block_allocator": kv.expected_from_reference(kv.SCENARIOS),
        "kv_sizing": sizing.expected_from_reference(sizing.BYTES_CASES, sizing.CAPACITY_CASES),
        "speculative": speculative.expected_from_reference(speculative.SPEC_CASES),
    }


def render() -> str:
    """The file's exact text: sorted keys, one level of indent, a final newline."""
    return json.dumps(expected_values(), indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Rewrite the committed file (or, with ``--check``, report whether it is current); the exit
    status."""
    parser = argparse.ArgumentParser(prog="python -m servelab_instructor.public_expected",
                                     description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if the file differs"
    )
    args = parser.parse_args(argv)
    text = render()
    current = EXPECTED_FILE.read_text(encoding="utf-8") if EXPECTED_FILE.exists() else None
    if args.check:
        print(f"{EXPECTED_FILE} is {'current' if current == text else 'out of date'}")
        return 0 if current == text else 1
    EXPECTED_FILE.write_text(text, encoding="utf-8")
    print(f"wrote {EXPECTED_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
