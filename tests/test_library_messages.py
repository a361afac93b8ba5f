"""What the library and the tools say to a reader agrees in number: no hedged plural ("token(s)").

Every string literal of the course library (``lib/servelab``, the instructor package) and of the
tools (``tools/*.py``), f-string pieces and docstrings included, is read from the source with
:mod:`ast`: exercise feedback, error messages, printed summaries and table captions are all built
from them. A count goes through :func:`servelab.prose.count` ("1 token", "2 tokens"); a unit in
parentheses after a space ("time (s)") is not a plural and passes, and neither is a docstring's
quoted code (````1 token(s)````, what :mod:`servelab.prose` exists to avoid). The question bank's text
(``bank.yaml``) is read as it is.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*(ROOT / "lib").rglob("*.py"), *(ROOT / "tools").glob("*.py")])
TEXTS = sorted((ROOT / "lib" / "servelab").rglob("*.yaml"))
HEDGED_PLURAL = re.compile(r"\w\(s\)(?!;)")  # "f(s);" is a statement of emitted JavaScript
LITERAL = re.compile(r"``.*?``", re.DOTALL)  # a docstring quoting code, e.g. what not to print


def hedged_plurals(source: str) -> list[str]:
    """'line N: string' for every string literal (or f-string piece) of ``source`` showing "(s)"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = LITERAL.sub(" ", node.value)
            found += [f"line {node.lineno}: {text[max(m.start() - 30, 0):m.end() + 10]!r}"
                      for m in HEDGED_PLURAL.finditer(text)]
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_hedged_plural_in_library_strings(path):
    found = hedged_plurals(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)}: use servelab.prose.count: " + "; ".join(found)


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_hedged_plural_in_library_texts(path):
    text = path.read_text(encoding="utf-8")
    found = [text[max(m.start() - 40, 0): m.end() + 10] for m in HEDGED_PLURAL.finditer(text)]
    assert not found, f"{path.relative_to(ROOT)}: {found}"


def test_the_scan_catches_a_hedged_plural():
    assert hedged_plurals('raise ValueError(f"{n} token(s) left")') == ["line 1: ' token(s) left'"]
    assert hedged_plurals('"""Never print ``1 token(s)``; count(1, "token") is "1 token"."""') == []
    assert hedged_plurals('def f():\n    """Takes the function(s)."""\n') != []
    assert hedged_plurals('js = "document.head.appendChild(s);"') == []
    assert hedged_plurals('x = f"{n} tokens"  # token(s) in a comment is not shown\nunit = "time (s)"') == []

