"""Which parts of a student's notebook the grader runs: the definitions, never the calls.

From every code cell except the set-up cell, :func:`graded_statements` keeps the top-level
statements that define things (imports, functions, classes, assignments, ``if``/``try`` blocks) and
drops everything else: bare expressions (prints, test calls), loops, the checker calls and the
import of the checkers, and any statement that calls one of the exercise's names (``x =
top_p(...)``), so a slow or endless test call in the notebook costs nothing. IPython magics (``%``,
``!`` lines) are dropped.
"""

from __future__ import annotations

import ast

import nbformat

__all__ = ["SETUP_PREFIX", "graded_statements", "is_setup_cell"]

SETUP_PREFIX = "# Set-up"
_KEPT = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
    ast.AugAssign,
    ast.If,
    ast.Try,
)
_NOTEBOOK_NAMES = ("worked_example",)


def is_setup_cell(source: str) -> bool:
    """True for the shipped set-up cell (it begins ``# Set-up. Where servelab is missing …``)."""
    return source.lstrip().startswith(SETUP_PREFIX)


def _checker_import(node: ast.stmt) -> bool:
    """``from servelab.exercises import check_x, worked_example``: the notebook's own checker
    import."""
    return (
        isinstance(node, ast.ImportFrom)
        and node.module == "servelab.exercises"
        and node.level == 0
        and all(a.name.startswith("check_") or a.name in _NOTEBOOK_NAMES for a in node.names)
    )


def _uses_checkers_or_calls(node: ast.stmt, names: set[str]) -> bool:
    """A statement that mentions a checker, or calls one of the student's names at top level."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and (sub.id.startswith("check_") or sub.id in _NOTEBOOK_NAMES):
            return True
        if (
            isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
            and isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Name)
            and sub.func.id in names
        ):
            return True
    return False


def _without_magics(source: str) -> str:
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    )


def graded_statements(
    nb: nbformat.NotebookNode, names: tuple[str, ...]
) -> tuple[list[str], list[str]]:
    """``(statements, problems)``: the sources to run in the worker, and cells that could not be
    parsed."""
    statements: list[str] = []
    problems: list[str] = []
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    for index, cell in enumerate(code_cells):
        if is_setup_cell(cell.source):
            continue
        source = _without_magics(cell.source)
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            problems.append(f"code cell {index} is not valid Python: {exc.msg} (line {exc.lineno})")
            continue
        for node in tree.body:
            if isinstance(node, _KEPT) and not _checker_import(node) \
                    and not _uses_checkers_or_calls(node, set(names)):
                statements.append(ast.unparse(node))
    return statements, problems
