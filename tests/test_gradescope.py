"""The Gradescope autograder, run locally: build autograder.zip, lay it out as Gradescope does under a
local $AUTOGRADER_ROOT, and grade a correct, a wrong and several cheating submissions with its
run_autograder. results.json is checked against the fields of Gradescope's autograder specification."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_grading import CORRECT, IGNORES_TPOT, _goodput, _write  # noqa: E402

from servelab_instructor.grader.isolation import NONE, choose
from servelab_instructor import gradescope

ROOT = Path(__file__).resolve().parents[1]
SEED = 424242
# Gradescope's autograder specification (gradescope-autograders.readthedocs.io, "Autograder Specifications").
TOP_LEVEL = {"score", "execution_time", "output", "output_format", "test_output_format", "test_name_format",
             "visibility", "stdout_visibility", "extra_data", "tests", "leaderboard"}
TEST_FIELDS = {"score", "max_score", "status", "name", "name_format", "number", "output", "output_format",
               "tags", "visibility", "extra_data"}
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}

pytestmark = pytest.mark.skipif(choose(unsafe=True).kind == NONE, reason="grading needs isolation")

CHEATS = {
    "writes-results": '''
    import os
    for root in ("/autograder", os.environ.get("AUTOGRADER_ROOT", "")) + ({root!r},):
        try:
            open(root + "/results/results.json", "w").write('{{"score": 999, "tests": []}}')
        except OSError:
            pass
    return 0.0
''',
    "reads-seed": '''
    import json
    return float(json.load(open({root!r} + "/source/grading.json"))["seed"])
''',
    "answer-import": '''
    from servelab_instructor.solutions import reference_goodput
    return reference_goodput(records, ttft_slo, tpot_slo, window)
''',
    "leaves-a-process": '''
    import subprocess, sys
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    return 0.0
''',
}


def validate(data: dict) -> None:
    """results.json as Gradescope documents it; AssertionError naming the first difference."""
    assert set(data) <= TOP_LEVEL, set(data) - TOP_LEVEL
    assert isinstance(data["tests"], list) and data["tests"]
    for test in data["tests"]:
        assert set(test) <= TEST_FIELDS, set(test) - TEST_FIELDS
        assert {"name", "score", "max_score", "output", "visibility"} <= set(test)
        assert isinstance(test["name"], str) and isinstance(test["output"], str)
        assert isinstance(test["score"], (int, float)) and isinstance(test["max_score"], (int, float))
        assert 0 <= test["score"] <= test["max_score"] and test["visibility"] in VISIBILITY
        assert test["status"] in ("passed", "failed")
    assert data["score"] == sum(t["score"] for t in data["tests"])
    assert isinstance(data["execution_time"], (int, float))


def archive_text(zip_path: Path, name: str) -> str:
    with zipfile.ZipFile(zip_path) as archive:
        return archive.read(name).decode()


@pytest.fixture(scope="module")
def autograder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("zip") / "autograder.zip"
    gradescope.build(out, SEED, ["ex05-goodput"], gradescope.Limits(case_seconds=2))
    return out


def _root(base: Path, zip_path: Path, body: str) -> Path:
    """A local $AUTOGRADER_ROOT laid out as Gradescope's harness lays it out."""
    root = base / "autograder"
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(root / "source")
    (root / "run_autograder").write_bytes((root / "source" / "run_autograder").read_bytes())
    (root / "results").mkdir()
    _write(_goodput(body.format(root=str(root))), root / "submission" / "ex05-goodput.ipynb")
    return root


def _run(root: Path) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "SERVELAB_AUTOGRADER_PYTHON": sys.executable,
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(root / "run_autograder")], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))


def test_the_zip_holds_what_gradescope_runs(autograder):
    with zipfile.ZipFile(autograder) as archive:
        names = set(archive.namelist())
        modes = {i.filename: i.external_attr >> 16 for i in archive.infolist()}
        config = json.loads(archive.read("grading.json"))
        setup = archive.read("setup.sh").decode()
    assert {"setup.sh", "run_autograder", "requirements.txt", "grading.json", "course/pyproject.toml",
            "instructor/servelab_instructor/grader/grade.py", "instructor/servelab_instructor/reference.py"} <= names
    assert modes["run_autograder"] & stat.S_IXUSR and modes["setup.sh"] & stat.S_IXUSR
    assert config["seed"] == SEED and config["exercises"] == ["ex05-goodput"]
    assert "requirements.txt" in setup and "bubblewrap" in setup and "/autograder/venv" in setup
    assert 'chmod -R go-rwx "$SOURCE"' in setup  # the seed and the references: root only
    for script in ("setup.sh", "run_autograder"):  # both parse as bash
        assert subprocess.run(["bash", "-n"], input=archive_text(autograder, script), text=True).returncode == 0
    assert not [n for n in names if "__pycache__" in n]


def test_correct_work_gets_full_points(tmp_path, autograder):
    done, data = _run(_root(tmp_path, autograder, CORRECT))
    validate(data)
    assert data["score"] == 8 and all(t["score"] == t["max_score"] for t in data["tests"])
    assert all(t["visibility"] == "after_published" for t in data["tests"])
    assert {t["name"] for t in data["tests"]} >= {"ex05-goodput: meeting the SLO exactly counts"}
    assert "score 8 of 8" in done.stdout


def test_wrong_work_loses_exactly_its_rule(tmp_path, autograder):
    _, data = _run(_root(tmp_path, autograder, IGNORES_TPOT))
    validate(data)
    lost = [t for t in data["tests"] if t["score"] < t["max_score"]]
    assert [t["name"] for t in lost] == [
        "ex05-goodput: a request that meets TTFT but misses the TPOT SLO does not count"]
    assert "returned" in lost[0]["output"] and "expected" not in lost[0]["output"]
    assert 0 < data["score"] < 8


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_every_cheat_scores_zero_and_results_json_is_the_grader_s(tmp_path, autograder, cheat):
    root = _root(tmp_path, autograder, CHEATS[cheat])
    zip_files = {p: p.read_bytes() for p in (root / "source").rglob("*") if p.is_file()}
    _, data = _run(root)
    validate(data)
    assert data["score"] == 0 and all(t["score"] == 0 for t in data["tests"])
    assert all(t["output"] for t in data["tests"])
    assert {p: p.read_bytes() for p in (root / "source").rglob("*") if p.is_file()} == zip_files
    assert sorted(p.name for p in (root / "results").iterdir()) == ["results.json"]
    if cheat == "writes-results":
        assert "refused: writing" in data["tests"][0]["output"]
    if cheat == "answer-import":
        assert "refused import: servelab_instructor" in data["tests"][0]["output"]


def test_a_missing_notebook_scores_zero_by_name(tmp_path, autograder):
    root = _root(tmp_path, autograder, CORRECT)
    (root / "submission" / "ex05-goodput.ipynb").rename(root / "submission" / "notes.ipynb")
    _, data = _run(root)
    validate(data)
    assert data["score"] == 0 and "no ex05-goodput.ipynb in the submission" in data["tests"][0]["output"]


def test_bad_input_is_named(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        gradescope.build(tmp_path / "a.zip", -1)
    with pytest.raises(ValueError, match="exercises must be among"):
        gradescope.build(tmp_path / "a.zip", 1, ["ex99-nothing"])
    monkeypatch.delenv("SERVELAB_GRADE_SEED", raising=False)
    assert gradescope.main(["build", "--out", str(tmp_path / "a.zip")]) == 2


def test_the_instructor_walkthrough_runs_as_written(tmp_path):
    from test_grading import _bash_block, _run_as_written

    _write(_goodput(CORRECT), tmp_path / "ex05-goodput.ipynb")
    script = _bash_block("The same zip runs on your machine")
    run = _run_as_written(script, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    assert "score 8 of 8" in run.stdout
    validate(json.loads((tmp_path / "root" / "results" / "results.json").read_text(encoding="utf-8")))
