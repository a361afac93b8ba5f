"""Every line of lib/**/*.py is at most 100 characters, except the lines listed in
tests/data/long_lines_allowed.txt: table rows, a literal block's command line, a doctest line, a
line inside a multi-line string's value; lines that cannot be broken without changing what they say.

``python tools/wrap_lines.py lib`` brings a file under the limit without changing its behaviour;
``python tools/wrap_lines.py --write-allow-list tests/data/long_lines_allowed.txt lib`` rewrites the
list from what stays long (read the diff: a line belongs there only if it cannot be broken)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 100
ALLOWED = ROOT / "tests" / "data" / "long_lines_allowed.txt"


def _long_lines() -> set[tuple[str, str]]:
    """``(path from the repository root, the line stripped)`` of every line over the limit."""
    found = set()
    for path in sorted((ROOT / "lib").rglob("*.py")):
        for row in path.read_text(encoding="utf-8").splitlines():
            if len(row) > LIMIT:
                found.add((path.relative_to(ROOT).as_posix(), row.strip()))
    return found


def _allowed() -> set[tuple[str, str]]:
    rows = ALLOWED.read_text(encoding="utf-8").splitlines()
    return {tuple(row.split("\t", 1)) for row in rows if row}


def test_every_line_is_at_most_100_characters_or_allowed():
    unexpected = sorted(_long_lines() - _allowed())
    assert not unexpected, (
        f"{len(unexpected)} lines over {LIMIT} characters; run python tools/wrap_lines.py "
        f"lib: " + "; ".join(f"{path}: {row[:60]}" for path, row in unexpected[:10])
    )


def test_the_allow_list_names_only_lines_that_are_still_long():
    stale = sorted(_allowed() - _long_lines())
    assert not stale, f"no longer long or gone, drop from {ALLOWED.name}: {stale[:10]}"
