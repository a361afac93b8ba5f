"""The batch grader on a corpus of honest and dishonest submissions, graded by the command line.

Honest work: correct (full points, even printing without a trailing newline), wrong (loses exactly
its rule's case), crashing, looping (only the looping function's cases are lost), noisy. Cheats, one
per class: importing the answer, the library's own mechanism, frame inspection, a lookup table of the
public cases, monkeypatching the checker's result, shadowing ``print``, a shadow package next to the
notebook, a detached process meant to outlive its worker and rewrite the sheet (refused). Every cheat scores 0
with a note naming what was refused or what happened, and the sheet is unchanged once every process
is gone. The folder uses LMS bulk-download names and holds files the grader must skip.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ROOT / "notebooks" / "exercises"
SEED = "424242"

GOODPUT_STUB = 'raise NotImplementedError("implement goodput")'
CORRECT = '''
    start, end = window
    good = [r for r in records if start <= r.finish <= end and r.ttft <= ttft_slo
            and (r.tpot is None or r.tpot <= tpot_slo)]
    print("graded", end="")  # no trailing newline
    return len(good) / (end - start)
'''
IGNORES_TPOT = '''
    start, end = window
    return sum(start <= r.finish <= end and r.ttft <= ttft_slo for r in records) / (end - start)
'''
CRASHES = '''
    return records[99].ttft
'''
NOISY = '''
    import sys
    print("debug " * 2000)
    print("warning: noisy", file=sys.stderr)
    start, end = window
    good = [r for r in records if start <= r.finish <= end and r.ttft <= ttft_slo
            and (r.tpot is None or r.tpot <= tpot_slo)]
    return len(good) / (end - start)
'''
HANGS_ON_ONE_TOKEN = '''
    import signal, time
    if len(records) == 1:  # the single-token case only: ignores the alarm and never returns
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        while True:
            time.sleep(0.1)
    start, end = window
    good = [r for r in records if start <= r.finish <= end and r.ttft <= ttft_slo
            and (r.tpot is None or r.tpot <= tpot_slo)]
    return len(good) / (end - start)
'''
LIBRARY_INSIDE = '''
    try:
        from servelab.metrics.latency import goodput as library
    except ImportError:
        return 0.0
    return library(records, ttft_slo, tpot_slo, window)
'''
FRAME = '''
    import sys
    return sys._getframe(1).f_locals["expected"]
'''
PATCH_RESULT = '''
    import servelab.exercises.result as result
    result.CaseResult.points = property(lambda self: self.max_points)
    return 0.0
'''
SHADOW_PRINT = '''
    return 0.0

import builtins
def print(*args, **kwargs):
    builtins.print('SERVELAB-GRADE-JSON:[{"checker": "check_goodput", "missing": [], "cases": []}]')
'''
OUTLIVES = '''
    return 0.0

import subprocess, sys
detached = subprocess.Popen([sys.executable, "-c", {script!r}], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

def _started():
    import os, time
    for _ in range(100):
        if os.path.exists({pid_file!r}):
            return True
        time.sleep(0.05)

ready = _started()
'''
# The detached process: it writes its pid, finds the grader's --out through /proc and rewrites the
# sheet for 6 s (it tries at once and after the grader has written it).
DETACHED = '''
import os, time
open({pid_file!r}, "w").write(str(os.getpid()))
grader = int(open(f"/proc/{{os.getppid()}}/stat").read().rsplit(")", 1)[1].split()[1])  # the worker's parent
args = open(f"/proc/{{grader}}/cmdline").read().split("\\0")
out = os.path.join(os.readlink(f"/proc/{{grader}}/cwd"), args[args.index("--out") + 1])
for _ in range(60):
    try:
        open(out, "a").write("outlived,ex05-goodput,TOTAL,8,8,,x\\n")
    except OSError:
        pass
    time.sleep(0.1)
'''

KV_BYTES_STUB = 'raise NotImplementedError("implement kv_bytes_per_token")'
KV_REQUESTS_STUB = 'raise NotImplementedError("implement max_requests")'
KV_LOOP = "    while True:\n        pass"
MAX_REQUESTS = '''
    pool_blocks = pool_bytes // (block_size * bytes_per_token)
    per_request = -(-(prompt_tokens + max_output_tokens) // block_size)
    return pool_blocks // per_request
'''
LOOKUP_BYTES = '''
    # the public cases' expected values, read off the checker's failure text
    table = {(2, 2, 2, 4, 2): 64, (32, 32, 8, 128, 2): 131072, (24, 16, 16, 64, 1): 49152}
    return table.get((n_layer, n_head, n_kv_head, d_head, bytes_per_elem), -1)
'''
LOOKUP_REQUESTS = '''
    table = {(1048576, 1024, 16, 100, 156): 4, (327680, 2048, 16, 17, 0): 5}
    return table.get((pool_bytes, bytes_per_token, block_size, prompt_tokens, max_output_tokens), -1)
'''

ALLOCATOR_MARK = "class Allocator:"
STOP_MARK = "class StopBuffer:"
SHADOW_MODULE = '''
from servelab.exercises.result import CaseResult, CheckResult
def check_batching_tick(tick, verbose=True, seed=None):
    return CheckResult("tick", (CaseResult("SHADOW", True, "", 10),))
'''


def _notebook(stem: str) -> nbformat.NotebookNode:
    return nbformat.read(str(EXERCISES / f"{stem}.ipynb"), as_version=4)


def _replace(nb: nbformat.NotebookNode, stub: str, body: str) -> nbformat.NotebookNode:
    cell = next(c for c in nb.cells if stub in c.source)
    cell.source = cell.source.replace(f"    {stub}", body.strip("\n"))
    return nb


def _replace_class(nb: nbformat.NotebookNode, mark: str, source: str) -> nbformat.NotebookNode:
    """Replace the whole cell that defines the stub class with ``source``."""
    next(c for c in nb.cells if c.source.startswith(mark) or f"\n{mark}" in c.source).source = source
    return nb


def _write(nb: nbformat.NotebookNode, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def _goodput(body: str) -> nbformat.NotebookNode:
    return _replace(_notebook("ex05-goodput"), GOODPUT_STUB, body)


def _corpus(folder: Path, pid_file: Path) -> None:
    """Write every submission; names follow Canvas, Moodle and the ``STUDENT__`` convention."""
    _write(_goodput(CORRECT), folder / "smithjohn_12345_67890_ex05-goodput.ipynb")
    _write(_goodput(IGNORES_TPOT), folder / "Wen Wrong_555_assignsubmission_file_" / "ex05-goodput.ipynb")
    _write(_goodput(CRASHES), folder / "crash__ex05-goodput.ipynb")
    _write(_goodput(NOISY), folder / "noisy" / "ex05-goodput.ipynb")
    _write(_goodput(HANGS_ON_ONE_TOKEN), folder / "hang__ex05-goodput.ipynb")
    kv = _replace(_replace(_notebook("ex07-kv-sizing"), KV_BYTES_STUB, KV_LOOP), KV_REQUESTS_STUB, MAX_REQUESTS)
    _write(kv, folder / "bob__ex07-kv-sizing (1).ipynb")
    # the cheats
    _write(_replace_class(_notebook("ex03-block-allocator"), ALLOCATOR_MARK,
                          "from servelab_instructor.reference import ReferenceAllocator as Allocator"),
           folder / "answer__ex03-block-allocator.ipynb")
    _write(_replace_class(_notebook("ex02-stop-buffer"), STOP_MARK,
                          "from servelab.sampling.stop_strings import StopStringBuffer as StopBuffer"),
           folder / "library__ex02-stop-buffer.ipynb")
    _write(_goodput(LIBRARY_INSIDE), folder / "inside__ex05-goodput.ipynb")
    _write(_goodput(FRAME), folder / "frame__ex05-goodput.ipynb")
    lookup = _replace(_replace(_notebook("ex07-kv-sizing"), KV_BYTES_STUB, LOOKUP_BYTES), KV_REQUESTS_STUB,
                      LOOKUP_REQUESTS)
    _write(lookup, folder / "table__ex07-kv-sizing.ipynb")
    _write(_goodput(PATCH_RESULT), folder / "patch__ex05-goodput.ipynb")
    patched = _goodput("    return 0.0")
    patched.cells.append(nbformat.v4.new_code_cell(
        "import servelab.exercises.result as result\n"
        "result.CaseResult.points = property(lambda self: self.max_points)"))
    _write(patched, folder / "patchtop__ex05-goodput.ipynb")
    _write(_goodput(SHADOW_PRINT), folder / "print__ex05-goodput.ipynb")
    _write(_notebook("ex04-batching-tick"), folder / "shadow" / "ex04-batching-tick.ipynb")
    (folder / "shadow" / "servelab" / "exercises").mkdir(parents=True)
    (folder / "shadow" / "servelab" / "__init__.py").write_text("")
    (folder / "shadow" / "servelab" / "exercises" / "__init__.py").write_text("")
    (folder / "shadow" / "servelab" / "exercises" / "scheduling.py").write_text(SHADOW_MODULE)
    script = DETACHED.format(pid_file=str(pid_file))
    _write(_goodput(OUTLIVES.format(script=script, pid_file=str(pid_file))), folder / "outlive__ex05-goodput.ipynb")
    # files to skip
    (folder / "readme.txt").write_text("not a notebook")
    _write(_notebook("ex05-goodput"), folder / "nobody.ipynb")


def _grade(folder: Path, *extra: str, out: str = "grades.csv") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib"), "OMP_NUM_THREADS": "1", "SERVELAB_GRADE_SEED": SEED}
    return subprocess.run([sys.executable, "-m", "servelab_instructor.grader", "grade", str(folder), "--out", out,
                           "--case-time", "1", *extra], cwd=folder.parent, env=env, capture_output=True,
                          text=True, timeout=240)


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("cohort")
    folder, pid_file = base / "submissions", base / "detached.pid"
    _corpus(folder, pid_file)
    roster = base / "roster.csv"
    roster.write_text("student,name\nsmithjohn,\"Smith, John\"\nabsent,\"Absent, Amy\"\n", encoding="utf-8")
    run = _grade(folder, "--jobs", "2", "--roster", str(roster), "--feedback", "feedback")
    assert run.returncode == 0, run.stderr
    sheet = base / "grades.csv"
    written = sheet.read_bytes()
    with sheet.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return {"rows": rows, "stdout": run.stdout, "sheet": sheet, "bytes": written, "pid_file": pid_file,
            "base": base}


def _cases(graded: dict, student: str) -> dict[str, dict]:
    return {r["case"]: r for r in graded["rows"] if r["student"] == student}


def _total(graded: dict, student: str) -> tuple[int, int]:
    total = _cases(graded, student)["TOTAL"]
    return int(total["points"]), int(total["max_points"])


def test_long_sheet_has_a_path_column_and_one_row_per_case(graded):
    assert list(graded["rows"][0]) == ["student", "exercise", "case", "points", "max_points", "note", "path"]
    ada = _cases(graded, "smithjohn")
    assert len(ada) == 7 and ada["TOTAL"]["path"].endswith("smithjohn_12345_67890_ex05-goodput.ipynb")


def test_correct_work_gets_every_point_even_without_a_trailing_newline(graded):
    points, maximum = _total(graded, "smithjohn")
    assert points == maximum == 8
    assert _total(graded, "noisy") == (8, 8)


def test_wrong_work_loses_exactly_its_rule(graded):
    rows = _cases(graded, "Wen Wrong")
    lost = {case for case, r in rows.items() if case != "TOTAL" and int(r["points"]) < int(r["max_points"])}
    assert lost == {"a request that meets TTFT but misses the TPOT SLO does not count"}
    note = rows["a request that meets TTFT but misses the TPOT SLO does not count"]["note"]
    assert "goodput([RequestTiming(" in note and "returned" in note and "expected" not in note


def test_a_crash_is_a_failed_case_with_its_error(graded):
    rows = _cases(graded, "crash")
    assert _total(graded, "crash")[0] == 0
    assert all("raised IndexError" in r["note"] for case, r in rows.items() if case != "TOTAL")


def test_an_endless_function_costs_only_its_own_cases(graded):
    hang = _cases(graded, "hang")
    assert int(hang["a single-token request has no TPOT to miss"]["points"]) == 0
    assert "time limit" in hang["a single-token request has no TPOT to miss"]["note"]
    assert _total(graded, "hang") == (7, 8)
    bob = _cases(graded, "bob")
    lost = {c for c, r in bob.items() if c != "TOTAL" and int(r["points"]) < int(r["max_points"])}
    assert lost == {"K and V both count: 2 x layers x KV heads x head dim x bytes",
                    "grouped-query attention: only the KV heads are cached",
                    "the element width sets the bytes (fp32 = 4, int8 = 1)"}
    assert _total(graded, "bob")[0] == 6


@pytest.mark.parametrize("student, named", [
    ("answer", "refused import: servelab_instructor.reference"),
    ("library", "refused import: servelab.sampling.stop_strings"),
    ("inside", "refused import: servelab.metrics.latency.goodput"),
    ("frame", "raised KeyError: 'expected'"),
    ("table", "returned -1"),
    ("patch", "refused import: servelab.exercises.result"),
    ("patchtop", "refused import: servelab.exercises.result"),
    ("print", "returned 0.0"),
    ("shadow", "not implemented yet"),
    ("outlive", "refused: starting a process (subprocess.Popen)"),
])
def test_every_cheat_scores_zero_with_a_note_naming_it(graded, student, named):
    rows = _cases(graded, student)
    assert _total(graded, student)[0] == 0 and _total(graded, student)[1] > 0
    cases = [r for case, r in rows.items() if case != "TOTAL"]
    assert cases and all(int(r["points"]) == 0 and named in r["note"] for r in cases), cases[0]["note"]
    assert "SHADOW" not in rows


def test_no_hidden_expected_value_reaches_a_note(graded):
    notes = "\n".join(r["note"] for r in graded["rows"] if r["student"] != "frame")  # its KeyError names it
    assert "expected" not in notes


def test_the_sheet_is_unchanged_after_every_process_is_gone(graded):
    time.sleep(1.0)
    if graded["pid_file"].exists():  # only where a process could be started and reach the grader's files
        with pytest.raises(ProcessLookupError):
            os.kill(int(graded["pid_file"].read_text()), 0)
    assert graded["sheet"].read_bytes() == graded["bytes"]
    assert b"outlived" not in graded["bytes"]


def test_skipped_files_and_missing_students_are_listed(graded):
    out = graded["stdout"]
    assert "readme.txt: not a notebook" in out and "nobody.ipynb: no student name" in out
    assert "missing: absent (0 points)" in out
    assert "smithjohn" in out and "wrote" in out


def test_feedback_has_one_file_per_student_with_rules_inputs_and_returns(graded):
    folder = graded["base"] / "feedback"
    files = {p.stem for p in folder.glob("*.md")}
    assert {"smithjohn", "absent", "Wen_Wrong", "answer"} <= files
    wrong = (folder / "Wen_Wrong.md").read_text(encoding="utf-8")
    assert "### Rule: a request that meets TTFT but misses the TPOT SLO does not count" in wrong
    assert "returned" in wrong and "expected" not in wrong
    assert "No exercise notebook" in (folder / "absent.md").read_text(encoding="utf-8")


def test_canvas_and_moodle_sheets_with_a_missing_student(tmp_path):
    folder = tmp_path / "subs"
    _write(_goodput(CORRECT), folder / "smithjohn_12345_67890_ex05-goodput.ipynb")
    _write(_goodput(IGNORES_TPOT), folder / "bob__ex05-goodput (1).ipynb")
    roster = tmp_path / "roster.csv"
    roster.write_text("student,name,sis_login_id,first_name,last_name,email\n"
                      "smithjohn,\"Smith, John\",js1,John,Smith,js@uni.edu\n"
                      "absent,\"Absent, Amy\",aa2,Amy,Absent,aa@uni.edu\n"
                      "bob,\"Builder, Bob\",bb3,Bob,Builder,bb@uni.edu\n", encoding="utf-8")
    canvas = _grade(folder, "--format", "canvas", "--roster", str(roster), out="canvas.csv")
    assert canvas.returncode == 0, canvas.stderr
    rows = list(csv.reader((tmp_path / "canvas.csv").open(encoding="utf-8")))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "ex05-goodput", "servelab total"]
    assert rows[1][0] == "Points Possible" and rows[1][5:] == ["8", "8"]
    by_name = {r[0]: r for r in rows[2:]}
    assert by_name["Smith, John"][1] == "12345" and by_name["Smith, John"][5:] == ["8", "8"]
    assert by_name["Absent, Amy"][3] == "aa2" and by_name["Absent, Amy"][5:] == ["0", "0"]
    assert 0 < int(by_name["Builder, Bob"][5]) < 8

    from servelab_instructor.grader.lms import write_sheet
    from servelab_instructor.grader.grade import CaseGrade
    from servelab_instructor.grader.lms import read_roster

    graded = [CaseGrade("smithjohn", "ex05-goodput", "TOTAL", 8, 8, "", "a.ipynb", "12345"),
              CaseGrade("bob", "ex05-goodput", "TOTAL", 6, 8, "", "b.ipynb"),
              CaseGrade("bob", "ex05-goodput", "TOTAL", 7, 8, "", "b (1).ipynb")]
    write_sheet(graded, tmp_path / "moodle.csv", "moodle", read_roster(roster))
    moodle = list(csv.reader((tmp_path / "moodle.csv").open(encoding="utf-8")))
    assert moodle[0] == ["First name", "Last name", "ID number", "Email address", "ex05-goodput (Real)",
                         "Total (Real)"]
    assert ["Amy", "Absent", "", "aa@uni.edu", "0", "0"] in moodle
    assert ["Bob", "Builder", "", "bb@uni.edu", "7", "7"] in moodle  # the best copy counts
    assert ["John", "Smith", "12345", "js@uni.edu", "8", "8"] in moodle


def test_a_seed_is_required_and_bad_input_is_named(tmp_path):
    from servelab_instructor.grader.grade import grade_submissions
    from servelab_instructor.grader.lms import read_roster

    env = {k: v for k, v in os.environ.items() if k != "SERVELAB_GRADE_SEED"}
    env["PYTHONPATH"] = str(ROOT / "lib")
    run = subprocess.run([sys.executable, "-m", "servelab_instructor.grader", "grade", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "SERVELAB_GRADE_SEED" in run.stderr
    with pytest.raises(ValueError, match="no exercise notebook"):
        grade_submissions(tmp_path, seed=1)
    (tmp_path / "r.csv").write_text("name\nx\n")
    with pytest.raises(ValueError, match="'student' column"):
        read_roster(tmp_path / "r.csv")


# The grader's command line with the instructor package blocked, as on a machine with only the wheel installed.
WITHOUT_INSTRUCTOR = ("import sys; sys.modules['servelab_instructor.reference'] = None; "
                      "from servelab_instructor.grader.__main__ import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("instructor", [True, False], ids=["with-reference", "without-reference"])
def test_the_grader_needs_the_instructor_reference_and_names_it_when_missing(tmp_path, instructor):
    right_bytes = "    return 2 * n_layer * n_kv_head * d_head * bytes_per_elem"
    kv = _replace(_replace(_notebook("ex07-kv-sizing"), KV_BYTES_STUB, right_bytes), KV_REQUESTS_STUB, MAX_REQUESTS)
    _write(kv, tmp_path / "submissions" / "bob__ex07-kv-sizing.ipynb")
    sheet = tmp_path / "grades.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib"), "OMP_NUM_THREADS": "1", "SERVELAB_GRADE_SEED": SEED}
    start = ["-m", "servelab_instructor.grader"] if instructor else ["-c", WITHOUT_INSTRUCTOR]
    run = subprocess.run([sys.executable, *start, "grade", str(tmp_path / "submissions"), "--out", str(sheet),
                          "--case-time", "1"], env=env, capture_output=True, text=True, timeout=120)
    if instructor:
        assert run.returncode == 0, run.stderr
        with sheet.open(encoding="utf-8") as handle:
            total = next(r for r in csv.DictReader(handle) if r["case"] == "TOTAL")
        assert (total["student"], total["points"], total["max_points"]) == ("bob", "10", "10")
    else:
        assert run.returncode == 2 and not sheet.exists()
        assert "servelab_instructor" in run.stderr and "make setup" in run.stderr and "PYTHONPATH" in run.stderr


def test_submission_names_from_lms_downloads(tmp_path):
    from servelab_instructor.grader.submissions import find_submissions

    for name in ("smithjohn_LATE_12345_67890_ex05-goodput-1.ipynb", "bob__ex07-kv-sizing (1).ipynb",
                 "Cy Young_777_assignsubmission_file_/ex10-scheduler-tick.ipynb", "dee/ex01.ipynb",
                 "eve/notes.ipynb"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    found, skipped = find_submissions(tmp_path)
    assert {(s.student, s.stem, s.lms_id) for s in found} == {
        ("smithjohn", "ex05-goodput", "12345"), ("bob", "ex07-kv-sizing", ""),
        ("Cy Young", "ex10-scheduler-tick", "777"), ("dee", "ex01-sampling-filters", "")}
    assert [(s.path.name, "no exercise" in s.reason) for s in skipped] == [("notes.ipynb", True)]


def test_the_set_up_cell_of_every_shipped_notebook_is_left_out():
    from servelab.exercises.catalog import EXERCISES as CATALOG
    from servelab_instructor.grader.extract import graded_statements, is_setup_cell

    for stem, exercise in CATALOG.items():
        nb = _notebook(stem)
        assert sum(is_setup_cell(c.source) for c in nb.cells if c.cell_type == "code") == 1, stem
        statements, problems = graded_statements(nb, tuple(n for _, ns in exercise.checks for n in ns))
        assert not problems and not any("pick_device" in s or "check_" in s for s in statements), stem


PAGED_ATTENTION = '''
    block_size, length = k_cache.shape[1], int(positions[-1]) + 1
    p = torch.arange(length)
    physical = torch.tensor(block_table)[p // block_size]
    group = q.shape[1] // k_cache.shape[2]
    k = k_cache[physical, p % block_size].repeat_interleave(group, dim=1).transpose(0, 1)
    v = v_cache[physical, p % block_size].repeat_interleave(group, dim=1).transpose(0, 1)
    mask = p[None, :] <= positions[:, None]
    return F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask).transpose(0, 1)
'''
SCHEDULE_WITHOUT_BLOCKS = '''
    plan, budget = [], token_budget
    for rid, computed, tokens, _ in running:
        if budget:
            plan.append((rid, min(tokens - computed, budget)))
            budget -= plan[-1][1]
    for admitted, (rid, computed, tokens, _) in enumerate(waiting):
        if not budget or len(running) + admitted >= max_num_seqs:
            break
        plan.append((rid, min(tokens - computed, budget)))
        budget -= plan[-1][1]
    return plan
'''


@pytest.mark.parametrize("stem, stub, body, lost", [
    ("ex09-paged-attention", 'raise NotImplementedError("implement paged_attention")', PAGED_ATTENTION, set()),
    ("ex10-scheduler-tick", 'raise NotImplementedError("implement schedule")', SCHEDULE_WITHOUT_BLOCKS,
     {"a running sequence short of blocks gets nothing; the next one still runs"}),
])
def test_the_build_exercises_are_graded(tmp_path, stem, stub, body, lost):
    from servelab_instructor.grader.grade import grade_notebook

    _write(_replace(_notebook(stem), stub, body), tmp_path / f"eve__{stem}.ipynb")
    rows = grade_notebook(tmp_path / f"eve__{stem}.ipynb", "eve", seed=int(SEED))
    total = rows[-1]
    assert total.case == "TOTAL" and total.max_points > 0 and not total.note
    assert lost <= {r.case for r in rows[:-1] if r.points < r.max_points}
    assert (total.points == total.max_points) == (not lost)


def _bash_block(heading: str) -> str:
    """The first ```bash block after ``heading`` on the instructor page."""
    text = (ROOT / "book" / "instructor.md").read_text(encoding="utf-8")
    after = text[text.index(heading):]
    return after.split("```bash\n", 1)[1].split("```", 1)[0]


def _run_as_written(script: str, folder: Path) -> subprocess.CompletedProcess:
    """Run ``script`` with bash in ``folder``, ``python`` on PATH being this interpreter."""
    shims = folder / "bin"
    shims.mkdir()
    (shims / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (shims / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT / "lib"),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", "-e", "-c", script], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_instructor_walkthrough_runs_as_written(tmp_path):
    folder = tmp_path / "submissions"
    _write(_goodput(CORRECT), folder / "smithjohn_12345_67890_ex05-goodput.ipynb")
    _write(_goodput(IGNORES_TPOT), folder / "Alice Smith_12345_assignsubmission_file_" / "ex05-goodput.ipynb")
    _write(_goodput(CRASHES), folder / "bob__ex05-goodput (1).ipynb")
    (tmp_path / "roster.csv").write_text(
        "student,name,first_name,last_name,email\nsmithjohn,\"Smith, John\",John,Smith,js@uni.edu\n"
        "Alice Smith,\"Smith, Alice\",Alice,Smith,as@uni.edu\nbob,\"Builder, Bob\",Bob,Builder,bb@uni.edu\n"
        "amy,\"Absent, Amy\",Amy,Absent,aa@uni.edu\n", encoding="utf-8")
    run = _run_as_written(_bash_block("### A cohort from export to LMS upload"), tmp_path)
    assert run.returncode == 0, run.stderr + run.stdout
    canvas = {r[0]: r for r in csv.reader((tmp_path / "canvas.csv").open(encoding="utf-8"))}
    assert canvas["Smith, John"][-1] == "8" and canvas["Absent, Amy"][-1] == "0"
    assert canvas["Builder, Bob"][-1] == "0" and 0 < int(canvas["Smith, Alice"][-1]) < 8
    moodle = list(csv.reader((tmp_path / "moodle.csv").open(encoding="utf-8")))
    assert ["Amy", "Absent", "", "aa@uni.edu", "0", "0"] in moodle
    assert {p.name for p in (tmp_path / "feedback").iterdir()} == {"smithjohn.md", "Alice_Smith.md", "bob.md",
                                                                   "amy.md"}
    assert "path" in (tmp_path / "grades-long.csv").read_text(encoding="utf-8").splitlines()[0]


def test_the_page_s_rubric_example_matches_the_bank():
    from servelab.questions import load_bank

    text = (ROOT / "book" / "instructor.md").read_text(encoding="utf-8")
    q6 = next(q for q in load_bank().questions if q.id == "Q6")
    assert "Q6 (the exact support sets) is worth 5: 2 for" in text
    assert q6.rubric.max_points == 5 and [p for p, _ in q6.rubric.ideas] == [2, 2, 1]
    assert q6.rubric.mistake_points == 1 and "strictly below" in q6.answer.mistakes[0]
