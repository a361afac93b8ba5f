"""The instructor switch: both documented forms reach jupyter-book as SERVELAB_SOLUTIONS=0."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLAG = re.compile(r"SERVELAB_SOLUTIONS=(\S+) \S*jupyter-book build")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def _planned_flag(*make_args: str, env_solutions: str | None = None) -> str:
    """The SERVELAB_SOLUTIONS value that `make -n book` would pass to jupyter-book."""
    env = {k: v for k, v in os.environ.items() if k not in ("SERVELAB_SOLUTIONS", "SOLUTIONS", "MAKEFLAGS")}
    if env_solutions is not None:
        env["SERVELAB_SOLUTIONS"] = env_solutions
    plan = subprocess.run(["make", "-n", "book", *make_args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True).stdout
    flags = FLAG.findall(plan)
    assert len(flags) == 1, plan
    return flags[0]


def test_default_build_keeps_solutions():
    assert _planned_flag() == "1"


def test_environment_variable_hides_solutions():
    assert _planned_flag(env_solutions="0") == "0"


def test_make_variable_hides_solutions():
    assert _planned_flag("SOLUTIONS=0") == "0"


def test_make_variable_wins_over_environment():
    assert _planned_flag("SOLUTIONS=1", env_solutions="0") == "1"


def test_instructor_page_names_both_forms():
    text = (ROOT / "book" / "instructor.md").read_text(encoding="utf-8")
    assert "SERVELAB_SOLUTIONS=0 make book" in text and "make book SOLUTIONS=0" in text
