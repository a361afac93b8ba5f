"""tools/wrap_lines.py: every line it can break ends up at most 100 characters, the syntax tree
stays the same (docstring whitespace aside), and what must stay as written does."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("wrap_lines", ROOT / "tools" / "wrap_lines.py")
wrap_lines = importlib.util.module_from_spec(_spec)
sys.modules["wrap_lines"] = wrap_lines
_spec.loader.exec_module(wrap_lines)

WORDS = "the scheduler admits a request when its KV blocks fit in the pool and a batch slot is free"
SAMPLE = textwrap.dedent(f'''\
    """Module: {WORDS}, {WORDS}.

    A short paragraph stays as written.

    * a bullet: {WORDS}, {WORDS}.
    * a second bullet.

    ==========  ============================================================================================
    name        a table row longer than the limit: kept, since re-wrapping would break the table's columns
    ==========  ============================================================================================

    Usage::

        python -m servelab.loadgen --url URL --model NAME --closed-loop --concurrency 4 --num-requests 100
    """

    x = [1,2]  # left alone: short lines are never formatted


    def admit(request_id: str, num_blocks: int, block_size: int, max_model_len: int, enable: bool) -> int:
        """Args:
            request_id: {WORDS} and a bit more text.
            num_blocks: short.
        """
        total = num_blocks * block_size + max_model_len  # the number of tokens the pool holds, for the check
        import os  # noqa: F401  (imported here on purpose, to show a pragma that must stay on its own line)
        message = f"request {{request_id}} asks for {{total}} tokens, more than the pool holds; lower max_tokens"
        return total if enable else len(message)
    ''')


@pytest.fixture(scope="module")
def wrapped() -> str:
    return wrap_lines.wrap_source(SAMPLE, ROOT / "lib" / "sample.py")


def test_every_line_that_can_break_fits(wrapped):
    long = [row for row in wrapped.splitlines() if len(row) > 100]
    assert SAMPLE != wrapped and all("table row" in row or "=====" in row or "--concurrency" in row
                                     for row in long), long


def test_the_tree_is_the_same_and_a_second_run_changes_nothing(wrapped):
    assert wrap_lines.tree_dump(SAMPLE) == wrap_lines.tree_dump(wrapped)
    assert wrap_lines.wrap_source(wrapped, ROOT / "lib" / "sample.py") == wrapped


def test_the_check_tells_a_code_change_from_docstring_whitespace():
    assert wrap_lines.tree_dump('def f():\n    """a b"""\n') == wrap_lines.tree_dump(
        'def f():\n    """a\n    b"""\n'
    )
    assert wrap_lines.tree_dump("x = 'a b'\n") != wrap_lines.tree_dump("x = 'a  b'\n")
    assert wrap_lines.tree_dump("x = 1\n") != wrap_lines.tree_dump("x = 2\n")


def test_tables_literal_blocks_and_short_lines_stay_as_written(wrapped):
    for row in SAMPLE.splitlines():
        if (
            "table row" in row
            or "=====" in row
            or "--concurrency" in row
            or row.startswith("x = [1,2]")
        ):
            assert row in wrapped.splitlines(), row
    assert "A short paragraph stays as written." in wrapped.splitlines()


def test_a_bullet_keeps_its_hanging_indent_and_a_field_its_own(wrapped):
    rows = wrapped.splitlines()
    bullet = rows.index(next(r for r in rows if r.startswith("* a bullet")))
    assert rows[bullet + 1].startswith("  ") and not rows[bullet + 1].startswith("   ")
    field = rows.index(next(r for r in rows if r.strip().startswith("request_id: the")))
    assert rows[field + 1].startswith(" " * 12) and not rows[field + 1].startswith(" " * 13)
    assert rows[field + 2].strip() == "num_blocks: short."


def test_a_trailing_comment_moves_above_and_a_pragma_stays(wrapped):
    rows = wrapped.splitlines()
    total = rows.index(next(r for r in rows if r.strip().startswith("total = ")))
    assert rows[total - 1].strip() == "# the number of tokens the pool holds, for the check"
    assert any(r.strip() == "import os  # noqa: F401" for r in rows)
    assert any("(imported here on purpose" in r and r.strip().startswith("#") for r in rows)


def test_a_long_string_becomes_adjacent_literals():
    source = (
        'def f(request_id, total):\n    raise ValueError(f"request {request_id} asks for '
        '{total} tokens, '
        'more than the pool holds; lower max_tokens or raise max_model_len")\n'
    )
    out = wrap_lines.wrap_source(source, ROOT / "lib" / "sample.py")
    assert all(len(row) <= 100 for row in out.splitlines()) and out.count('f"') >= 2
    assert wrap_lines.tree_dump(source) == wrap_lines.tree_dump(out)


def test_a_cut_never_falls_inside_a_replacement_field():
    split = wrap_lines.split_literal('f"{a + b:>10} {c} {d[\'x y\']} and some words after it"', 24)
    assert split is not None and all(
        part.count("{") == part.count("}") for part in split.split('" f"')
    )
