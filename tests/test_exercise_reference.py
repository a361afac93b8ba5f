"""The reference solutions are instructor-only: out of the wheel, not needed by the public cases, and the
public cases' committed expected values equal what the reference computes now."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from servelab.exercises import (check_admission, check_batching_tick, check_block_allocator, check_kv_sizing,
                                check_speculative, worked_example)
from servelab.exercises.catalog import EXERCISES
from servelab.exercises.expected import EXPECTED_FILE, MissingReference, paired, public_expected, reference
from servelab_instructor import public_expected as generator
from servelab_instructor.reference import (ReferenceAllocator, reference_accept, reference_admit,
                                           reference_kv_bytes_per_token, reference_max_requests,
                                           reference_residual, reference_tick)

ROOT = Path(__file__).resolve().parents[1]
ANSWER_NAMES = ("ReferenceAllocator", "reference_admit", "reference_tick", "reference_accept", "reference_residual",
                "reference_kv_bytes_per_token", "reference_max_requests")
CHECKS = [  # each checker whose expected values come from the reference, with the reference as the student
    (check_block_allocator, (ReferenceAllocator,)),
    (check_batching_tick, (reference_tick,)),
    (check_speculative, (reference_accept, reference_residual)),
    (check_kv_sizing, (reference_kv_bytes_per_token, reference_max_requests)),
    (check_admission, (reference_admit,)),
]


@pytest.fixture
def without_reference(monkeypatch):
    """The instructor package made unimportable, as in a student's install of the wheel."""
    for name in ("servelab_instructor", "servelab_instructor.reference"):
        monkeypatch.setitem(sys.modules, name, None)


def test_committed_public_expected_values_equal_the_reference():
    assert EXPECTED_FILE.read_text(encoding="utf-8") == generator.render(), (
        f"{EXPECTED_FILE.name} has drifted from the reference; run python -m servelab_instructor.public_expected")


def test_the_drift_check_notices_a_changed_value(monkeypatch, capsys):
    assert generator.main(["--check"]) == 0
    real = generator.expected_values
    monkeypatch.setattr(generator, "expected_values", lambda: {**real(), "admission": [[["X"], []]]})
    assert generator.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().out


def test_hand_written_single_ticks_equal_the_reference():
    from servelab.exercises.scheduling import SINGLE_TICKS
    for _, (running, queue, capacity), expected in SINGLE_TICKS:
        assert reference_tick(dict(running), list(queue), capacity) == expected


@pytest.mark.parametrize("check, right", CHECKS, ids=[c[0].__name__ for c in CHECKS])
def test_public_cases_run_without_the_reference(without_reference, check, right):
    result = check(*right, verbose=False)
    assert result.passed and not result.not_implemented, result.report()
    with pytest.raises(MissingReference, match="servelab_instructor"):
        check(*right, verbose=False, seed=1)


@pytest.mark.parametrize("stem", sorted(EXERCISES))
def test_worked_examples_run_without_the_reference(without_reference, stem):
    assert "->" in worked_example(stem)


def test_missing_reference_names_the_package_and_how_to_get_it(without_reference):
    with pytest.raises(MissingReference) as error:
        reference()
    message = str(error.value)
    assert "servelab_instructor.reference" in message and "make setup" in message and "PYTHONPATH" in message


def test_a_short_expected_table_names_the_regeneration_command():
    with pytest.raises(ValueError, match="python -m servelab_instructor.public_expected"):
        paired("admission", (1, 2, 3), [1, 2])
    with pytest.raises(KeyError, match="no expected values for 'nothing'"):
        public_expected("nothing")


def _wheel_files(tmp_path: Path) -> dict[str, bytes]:
    """Build the wheel offline from a copy of the project files it is made of; its members and bytes."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "lib", source / "lib", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "-w", str(tmp_path / "dist"), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("servelab-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_the_wheel_holds_the_checkers_and_their_data_but_no_reference(tmp_path):
    files = _wheel_files(tmp_path)
    assert "servelab/exercises/kv.py" in files and "servelab/exercises/public_expected.json" in files
    assert not [n for n in files if n.startswith("servelab_instructor") or "_reference" in n]
    top_level = next(v for n, v in files.items() if n.endswith(".dist-info/top_level.txt"))
    assert top_level.decode().split() == ["servelab"]
    answers = [(n, a) for n, v in files.items() if n.endswith(".py") for a in ANSWER_NAMES
               if f"def {a}(".encode() in v or f"class {a}".encode() in v]
    assert not answers, answers
