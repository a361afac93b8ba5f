"""The wheel a student installs holds the student's package only: no notebook runner, no book renderer,
no GPU check, no grader and no export (those are build machinery in tools/ and book/_ext, or
instructor-only in servelab_instructor)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Paths inside the wheel that must not be there, each with what it would be.
FORBIDDEN = {
    r"(^|/)nbrun\.py$": "the notebook runner (tools/nbrun.py)",
    r"(^|/)course_map\.py$": "the architecture page's renderer (book/_ext/course_map.py)",
    r"(^|/)gpu_check\.py$": "the prepared GPU check (tools/gpu_check.py)",
    r"^servelab_instructor/": "the instructor package (reference solutions, grader, export)",
    r"^servelab/exercises/(_worker|sandbox|grade|lms|submissions|reaper|extract|isolation|__main__)\.py$": "the grader",
    r"^servelab/questions/(export|__main__)\.py$": "the assignment and answer-key export",
}
# What a student imports: present, or the wheel is empty for the wrong reason.
REQUIRED = ("servelab/__init__.py", "servelab/engine/engine.py", "servelab/exercises/__init__.py",
            "servelab/exercises/public_expected.json", "servelab/questions/bank.yaml",
            "servelab/bench/gpu_results.py")


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    """The file names inside a wheel built from a copy of the checkout (the checkout stays untouched)."""
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(ROOT / "lib", src / "lib",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    out = src / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--no-index", "-q", str(src), "-w", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = out.glob("servelab-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_holds_what_a_student_imports(wheel_names):
    missing = [name for name in REQUIRED if name not in wheel_names]
    assert not missing, f"missing from the wheel: {missing}"
    packages = {name.split("/")[0] for name in wheel_names if not name.split("/")[0].endswith(".dist-info")}
    assert packages == {"servelab"}, f"top-level entries of the wheel: {sorted(packages)}"


def test_no_build_machinery_grader_or_export_ships(wheel_names):
    shipped = [f"{name} ({why})" for name in wheel_names for pattern, why in FORBIDDEN.items()
               if re.search(pattern, name)]
    assert not shipped, "in the wheel, but not the student's: " + ", ".join(shipped)


def test_the_forbidden_patterns_match_what_they_name():
    probes = {"servelab/nbrun.py", "servelab/course_map.py", "servelab/bench/gpu_check.py",
              "servelab_instructor/reference.py", "servelab/exercises/grade.py", "servelab/questions/export.py"}
    for probe in probes:
        assert any(re.search(pattern, probe) for pattern in FORBIDDEN), probe
    assert not any(re.search(pattern, "servelab/exercises/kv.py") for pattern in FORBIDDEN)
