"""The §8 notebook's from-scratch engine, taken out of the notebook and held to the exercise checkers.

The notebook itself checks every step while it runs (nbval executes it); these tests read its
``# mini-engine, step N`` cells and check that the two functions the exercises ask students to write
(``paged_attention``, ``schedule``) pass the same checkers a student's code must pass, and that the
chapter's claim about the engine's size stays true.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from servelab.exercises import check_paged_attention, check_scheduler_tick

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "ch08-from-scratch.ipynb"
MARKER = "# mini-engine, step"


def engine_cells() -> list[str]:
    cells = nbformat.read(NOTEBOOK, as_version=4).cells
    return [c.source for c in cells if c.cell_type == "code" and c.source.startswith(MARKER)]


@pytest.fixture(scope="module")
def mini_engine() -> dict:
    """The namespace the engine cells define, run on the CPU after the notebook's import cell."""
    cells = nbformat.read(NOTEBOOK, as_version=4).cells
    imports = next(c.source for c in cells if c.cell_type == "code" and "load_checkpoint()" in c.source)
    namespace: dict = {"DEVICE": "cpu"}
    for source in [imports, *engine_cells()]:
        exec(compile(source, str(NOTEBOOK), "exec"), namespace)  # noqa: S102 - the course's own notebook
    return namespace


def test_the_engine_is_built_in_five_marked_steps_in_order():
    steps = [source.split(":", 1)[0].removeprefix(MARKER).strip() for source in engine_cells()]
    assert steps == sorted(steps) and sorted(set(steps)) == ["1", "2", "3", "4", "5"], steps


def test_the_engine_is_about_two_hundred_lines():
    code_lines = sum(1 for source in engine_cells() for line in source.splitlines()
                     if line.strip() and not line.strip().startswith("#"))
    assert 120 <= code_lines <= 230, code_lines


def test_the_chapters_paged_attention_passes_the_exercise_checker(mini_engine):
    result = check_paged_attention(mini_engine["paged_attention"], verbose=False)
    assert result.passed, [c.detail for c in result.failures]


def test_the_chapters_scheduler_tick_passes_the_exercise_checker(mini_engine):
    result = check_scheduler_tick(mini_engine["schedule"], verbose=False)
    assert result.passed, [c.detail for c in result.failures]


def test_the_engine_imports_no_part_of_the_course_engine():
    assert not any("servelab.engine" in source for source in engine_cells())
