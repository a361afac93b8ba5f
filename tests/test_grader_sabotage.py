"""A sabotage corpus graded beside honest submissions in one run of the grader's command line.

Each saboteur is a few lines in an ex05 notebook, run when its definitions load or when the grader calls
it: kill the grader (its parent, or found by a /proc scan), stop it, rewrite, delete or rename another
student's notebook, write into the grade sheet's folder, fork-bomb (through ``os.fork`` and around the
audit hook through ``ctypes``), fill the disk, connect to a server on 127.0.0.1, read another student's
notebook, close or flood the reply pipe. The saboteurs know every path (the worst case). Asserted: the
sheet is written, the honest students score exactly what they score graded alone, every saboteur scores
0 with a note naming what was refused or what failed, every input file is byte-identical afterwards,
nothing new appears beside the sheet, and the server saw no connection. Where bubblewrap is refused
(the fallback): a worker with a uid of its own cannot signal the grader, even around the audit hook; and
an ordinary user's grader gets bubblewrap through a user namespace.
"""

from __future__ import annotations

import csv
import hashlib
import os
import socket
import subprocess
import sys
import shutil
import threading
from pathlib import Path

import nbformat
import pytest

from servelab_instructor.grader.isolation import BUBBLEWRAP, choose

sys.path.insert(0, str(Path(__file__).parent))
from test_grading import (CORRECT, KV_BYTES_STUB, KV_REQUESTS_STUB, MAX_REQUESTS, _goodput,  # noqa: E402
                          _notebook, _replace, _write)

ROOT = Path(__file__).resolve().parents[1]
SEED = "424242"
RIGHT_BYTES = "    return 2 * n_layer * n_kv_head * d_head * bytes_per_elem"

pytestmark = pytest.mark.skipif(choose(unsafe=True).kind != BUBBLEWRAP,
                                reason="the corpus needs bubblewrap (make test installs it)")

# {paths} is filled with the honest students' notebooks, the sheet's folder and the server's port.
SCAN = '''
def _grader_pids():
    import os
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and b"servelab_instructor.grader" in open("/proc/" + entry + "/cmdline", "rb").read():
                found.append(int(entry))
        except OSError:
            pass
    return found
'''
SABOTAGE = {
    "killparent": ("load", '''
import os, signal
_ = os.kill(os.getppid(), signal.SIGKILL)
'''),
    "procscan": ("call", SCAN + '''
def _sabotage():
    import os, signal
    for pid in _grader_pids() or [1]:
        os.kill(pid, signal.SIGKILL)
'''),
    "sigstop": ("load", SCAN + '''
import os, signal
_stopped = [os.kill(pid, signal.SIGSTOP) for pid in _grader_pids() or [os.getppid()]]
'''),
    "rewrite": ("load", '''
_ = open({honest05!r}, "w").write("{{}}")
'''),
    "delete": ("load", '''
import os
_ = os.remove({honest07!r})
'''),
    "rename": ("call", '''
def _sabotage():
    import os
    os.rename({honest05!r}, {honest05!r} + ".old")
'''),
    "sheetdir": ("call", '''
def _sabotage():
    open({base!r} + "/grades.csv", "w").write("student,exercise,case,points\\nsheetdir,ex05-goodput,TOTAL,8\\n")
'''),
    "forkbomb": ("call", '''
def _sabotage():
    import os
    while True:
        os.fork()
'''),
    "ctypesbomb": ("call", '''
def _sabotage():
    import ctypes, time
    fork = ctypes.pythonapi.fork
    for _ in range(400):
        fork()
    time.sleep(30)
'''),
    "diskfill": ("call", '''
def _sabotage():
    block = b"x" * (1 << 19)
    for i in range(10000):
        open("fill" + str(i), "wb").write(block)
'''),
    "socket": ("call", '''
def _sabotage():
    import socket
    socket.create_connection(("127.0.0.1", {port}), timeout=0.5).sendall(b"stolen")
'''),
    "readother": ("load", '''
_stolen = open({honest05!r}).read()
'''),
    "closepipe": ("call", '''
def _sabotage():
    import os, sys
    os.close(int(sys.argv[2]))
'''),
    "floodpipe": ("call", '''
def _sabotage():
    import os, sys
    os.write(int(sys.argv[2]), b'{{"value": 8.0}}' * 100000)
'''),
}
NAMED = {  # what each saboteur's notes must name
    "killparent": "refused: sending signal 9 to process",
    "procscan": "sending signal 9 to process",
    "sigstop": "sending signal 19 to process",
    "rewrite": "refused: writing",
    "delete": "refused: changing",
    "rename": "refused: changing",
    "sheetdir": "refused: writing",
    "forkbomb": "refused: starting a process (os.fork)",
    "ctypesbomb": "",
    "diskfill": "No space left on device",
    "socket": "refused: network access",
    "readother": "No such file or directory",
    "closepipe": "closed the reply pipe",
    "floodpipe": "refused: writing to the grader's reply pipe",
}
CALLS_SABOTAGE = '''
    _sabotage()
    return 0.0
'''


def _honest(folder: Path) -> None:
    _write(_goodput(CORRECT), folder / "zhonest" / "ex05-goodput.ipynb")
    kv = _replace(_replace(_notebook("ex07-kv-sizing"), KV_BYTES_STUB, RIGHT_BYTES), KV_REQUESTS_STUB, MAX_REQUESTS)
    _write(kv, folder / "zhonest" / "ex07-kv-sizing.ipynb")


def _saboteur(name: str, paths: dict) -> object:
    when, source = SABOTAGE[name]
    nb = _goodput(CALLS_SABOTAGE if when == "call" else "    return 0.0")
    nb.cells.insert(len(nb.cells) - 1, nbformat.v4.new_code_cell(source.format(**paths)))
    return nb


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _grade(folder: Path, sheet: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib"), "OMP_NUM_THREADS": "1", "SERVELAB_GRADE_SEED": SEED}
    return subprocess.run([sys.executable, "-m", "servelab_instructor.grader", "grade", str(folder), "--out", str(sheet),
                           "--case-time", "2", "--time-limit", "10"], cwd=folder.parent, env=env,
                          capture_output=True, text=True, timeout=500)


def _rows(sheet: Path) -> list[dict]:
    with sheet.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _listening() -> tuple[socket.socket, list]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    seen: list = []

    def accept() -> None:
        while server.fileno() >= 0:
            try:
                seen.append(server.accept())
            except (TimeoutError, OSError):
                continue

    threading.Thread(target=accept, daemon=True).start()
    return server, seen


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    alone = tmp_path_factory.mktemp("alone")
    _honest(alone / "submissions")
    graded_alone = _grade(alone / "submissions", alone / "out" / "grades.csv")
    assert graded_alone.returncode == 0, graded_alone.stderr
    base = tmp_path_factory.mktemp("cohort")
    folder, out = base / "submissions", base / "out"
    _honest(folder)
    out.mkdir()
    server, seen = _listening()
    paths = {"honest05": str(folder / "zhonest" / "ex05-goodput.ipynb"),
             "honest07": str(folder / "zhonest" / "ex07-kv-sizing.ipynb"), "base": str(out),
             "port": server.getsockname()[1]}
    for name in SABOTAGE:
        _write(_saboteur(name, paths), folder / name / "ex05-goodput.ipynb")
    before = _hashes(folder)
    try:
        run = _grade(folder, out / "grades.csv")
    finally:
        server.close()
    return {"run": run, "rows": _rows(out / "grades.csv") if (out / "grades.csv").exists() else [],
            "alone": _rows(alone / "out" / "grades.csv"), "before": before, "after": _hashes(folder),
            "out": out, "seen": seen}


def test_the_sheet_is_written_for_everyone(corpus):
    assert corpus["run"].returncode == 0, corpus["run"].stderr[-3000:]
    assert "isolation: bubblewrap" in corpus["run"].stdout
    assert {r["student"] for r in corpus["rows"]} == {"zhonest", *SABOTAGE}


def test_honest_scores_are_exactly_those_graded_alone(corpus):
    keep = ("exercise", "case", "points", "max_points", "note")
    honest = [{k: r[k] for k in keep} for r in corpus["rows"] if r["student"] == "zhonest"]
    assert honest == [{k: r[k] for k in keep} for r in corpus["alone"]]
    assert sum(int(r["points"]) for r in honest if r["case"] == "TOTAL") == 18


@pytest.mark.parametrize("name", sorted(SABOTAGE))
def test_every_saboteur_scores_zero_with_a_note(corpus, name):
    rows = [r for r in corpus["rows"] if r["student"] == name]
    total = next(r for r in rows if r["case"] == "TOTAL")
    assert (total["points"], total["max_points"]) == ("0", "8")
    notes = "\n".join(r["note"] for r in rows)
    assert NAMED[name] in notes, notes[:2000]


def test_every_input_file_is_byte_identical_and_nothing_lands_beside_the_sheet(corpus):
    assert corpus["after"] == corpus["before"]
    assert "changed during grading" not in corpus["run"].stdout
    assert sorted(p.name for p in corpus["out"].iterdir()) == ["grades.csv"]
    assert "sheetdir,ex05-goodput,TOTAL,8" not in (corpus["out"] / "grades.csv").read_text(encoding="utf-8")


def test_no_connection_reached_the_host(corpus):
    assert corpus["seen"] == []


def test_without_isolation_the_grader_refuses_or_warns_by_name(monkeypatch, tmp_path):
    from servelab_instructor.grader import isolation

    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 1000)
    with pytest.raises(isolation.IsolationUnavailable, match="--unsafe") as refused:
        isolation.choose()
    assert "bubblewrap" in str(refused.value) and "kill or stop the grader" in str(refused.value)
    unsafe = isolation.choose(unsafe=True)
    assert unsafe.kind == isolation.NONE and unsafe.describe().startswith("WARNING: no isolation")
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 0)
    monkeypatch.setattr(isolation, "_reachable_by_others", lambda: True)
    assert isolation.choose().kind == isolation.SEPARATE_UID
    monkeypatch.setenv("SERVELAB_GRADE_ISOLATION", "bubblewrap")
    with pytest.raises(isolation.IsolationUnavailable, match="SERVELAB_GRADE_ISOLATION=bubblewrap"):
        isolation.choose()
    monkeypatch.setenv("SERVELAB_GRADE_ISOLATION", "chroot")
    with pytest.raises(ValueError, match="SERVELAB_GRADE_ISOLATION must be"):
        isolation.choose()


UID_SCRIPT = """
import json, sys, tempfile
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_grading import _goodput, _write
from servelab_instructor.grader import isolation
from servelab_instructor.grader.grade import grade_notebook
folder, found = Path(tempfile.mkdtemp()), {{}}
chosen = isolation.Isolation(isolation.SEPARATE_UID) if sys.argv[2] == "uid" else isolation.choose()
for name, body in json.loads(sys.argv[1]).items():
    _write(_goodput(body), folder / f"{{name}}__ex05-goodput.ipynb")
    rows = grade_notebook(folder / f"{{name}}__ex05-goodput.ipynb", name, 424242, isolation=chosen)
    found[name] = [rows[-1].points, "\\n".join(r.note for r in rows)]
print(json.dumps({{"isolation": chosen.describe(), **found}}))
"""
UID_BODIES = {
    "honest": CORRECT,
    "kill": "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 0.0",
    "uid": "    import os\n    return float(os.getuid())",
    # around the audit hook: libc's kill through ctypes; the kernel refuses it to another uid
    "ctypeskill": "    import ctypes, os\n    return float(ctypes.pythonapi.kill(os.getppid(), 9))",
}


def _python_others_can_run() -> list[str] | None:
    """This interpreter, or the system's of the same version with this venv's packages, if another uid
    can run it; None when there is none."""
    from servelab_instructor.grader import isolation

    if isolation._reachable_by_others():
        return [sys.executable]
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    return [str(system)] if system.exists() else None


def _grade_elsewhere(python: list[str], kind: str, user: list[str] = ()) -> dict:
    """UID_BODIES graded by ``python`` (run as ``user``, a command prefix) under isolation ``kind``;
    skips where that user has no isolation here (user namespaces refused)."""
    import json
    import site

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), *site.getsitepackages()]),
           "OMP_NUM_THREADS": "1", "HOME": "/tmp", "TMPDIR": "/tmp"}
    done = subprocess.run([*user, *python, "-c", UID_SCRIPT.format(tests=str(Path(__file__).parent)),
                           json.dumps(UID_BODIES), kind], env=env, cwd="/tmp", capture_output=True,
                          text=True, timeout=300)
    if "IsolationUnavailable" in done.stderr:
        pytest.skip(f"no isolation for this user here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_bubblewrap_for_an_ordinary_user():
    python = _python_others_can_run()
    if python is None:
        pytest.skip("no interpreter here that another uid can run")
    found = _grade_elsewhere(python, "choose", ["setpriv", "--reuid", "1000", "--regid", "1000",
                                                "--clear-groups"])
    assert found["isolation"].startswith("isolation: bubblewrap") and "uid of its own" not in found["isolation"]
    assert found["honest"][0] == 8
    assert found["kill"][0] == 0 and "sending signal 9 to process 1" in found["kill"][1]
    assert found["ctypeskill"][0] == 0  # its kill reached only the sandbox's own init, which ignores it


@pytest.mark.skipif(os.geteuid() != 0, reason="a separate uid needs root")
def test_a_separate_uid_cannot_signal_the_grader():
    python = _python_others_can_run()
    if python is None:
        pytest.skip("no interpreter here that another uid can run")
    found = _grade_elsewhere(python, "uid")
    assert "chmod -R go-rwx" in found["isolation"]  # this checkout's reference solutions are world-readable
    assert found["honest"][0] == 8
    assert found["kill"][0] == 0 and "sending signal 9 to process" in found["kill"][1]
    assert found["uid"][0] == 0 and "returned 6" in found["uid"][1]  # a uid from 61000 up
    assert found["ctypeskill"][0] == 0 and "returned -1.0" in found["ctypeskill"][1]  # EPERM


def test_files_changed_during_grading_are_reported(tmp_path):
    from servelab_instructor.grader.submissions import changed_files, snapshot

    for name in ("a/ex05-goodput.ipynb", "b/ex05-goodput.ipynb", "c/notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    before = snapshot(tmp_path)
    assert set(before.contents) == {tmp_path / "a/ex05-goodput.ipynb", tmp_path / "b/ex05-goodput.ipynb"}
    assert changed_files(before, tmp_path) == []
    (tmp_path / "a/ex05-goodput.ipynb").write_text("{}")
    (tmp_path / "b/ex05-goodput.ipynb").unlink()
    (tmp_path / "c/new.txt").write_text("x")
    assert changed_files(before, tmp_path) == [f"{tmp_path / 'a/ex05-goodput.ipynb'}: changed",
                                               f"{tmp_path / 'b/ex05-goodput.ipynb'}: deleted",
                                               f"{tmp_path / 'c/new.txt'}: added"]
