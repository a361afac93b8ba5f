"""The batch grader: a correct, a wrong and a crashing submission, graded from their notebooks."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "exercises" / "ex05-goodput.ipynb"
STUB = 'raise NotImplementedError("implement goodput")'

CORRECT = '''
    start, end = window
    good = [r for r in records if start <= r.finish <= end and r.ttft <= ttft_slo
            and (r.tpot is None or r.tpot <= tpot_slo)]
    return len(good) / (end - start)
'''
IGNORES_TPOT = '''
    start, end = window
    return sum(start <= r.finish <= end and r.ttft <= ttft_slo for r in records) / (end - start)
'''


def _submit(folder: Path, student: str, body: str | None) -> None:
    """A copy of the shipped notebook with the stub replaced by ``body`` (None: a cell that crashes)."""
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    cell = next(c for c in nb.cells if STUB in c.source)
    if body is None:
        cell.source = "raise RuntimeError('my kernel exploded')\n" + cell.source
    else:
        cell.source = cell.source.replace(f"    {STUB}", body.strip("\n"))
    (folder / student).mkdir(parents=True)
    nbformat.write(nb, str(folder / student / NOTEBOOK.name))


@pytest.fixture(scope="module")
def grades(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("submissions")
    _submit(folder, "ada", CORRECT)
    _submit(folder, "bob", IGNORES_TPOT)
    _submit(folder, "cy", None)
    out = folder / "grades.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib"), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "servelab.exercises", "grade", str(folder), "--out", str(out),
                          "--time-limit", "60"], env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    assert "ada" in run.stdout and "wrote" in run.stdout
    with out.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _rows(grades: list[dict], student: str) -> dict[str, dict]:
    return {r["case"]: r for r in grades if r["student"] == student and r["exercise"] == "ex05-goodput"}


def test_columns_and_one_row_per_case(grades):
    assert list(grades[0]) == ["student", "exercise", "case", "points", "max_points", "note"]
    cases = {s: set(_rows(grades, s)) for s in ("ada", "bob", "cy")}
    assert cases["ada"] == cases["bob"] == cases["cy"] and "TOTAL" in cases["ada"] and len(cases["ada"]) >= 7


def test_correct_submission_gets_every_point(grades):
    total = _rows(grades, "ada")["TOTAL"]
    assert int(total["points"]) == int(total["max_points"]) > 0


def test_wrong_submission_loses_exactly_the_tpot_case(grades):
    rows = _rows(grades, "bob")
    lost = {case for case, r in rows.items() if case != "TOTAL" and int(r["points"]) < int(r["max_points"])}
    assert lost == {"a request that meets TTFT but misses the TPOT SLO does not count"}
    total = rows["TOTAL"]
    assert 0 < int(total["points"]) < int(total["max_points"])


def test_crashing_submission_scores_zero_with_the_reason(grades):
    rows = _rows(grades, "cy")
    assert all(int(r["points"]) == 0 for r in rows.values())
    assert "RuntimeError: my kernel exploded" in rows["TOTAL"]["note"]
    assert all("not defined: goodput" in r["note"] for case, r in rows.items() if case != "TOTAL")


def test_empty_folder_is_an_error(tmp_path):
    from servelab.exercises.grade import grade_submissions

    with pytest.raises(ValueError, match="no exercise notebook"):
        grade_submissions(tmp_path)


def test_a_notebook_over_its_time_limit_scores_zero(tmp_path, monkeypatch):
    from servelab.exercises.grade import grade_notebook

    monkeypatch.setenv("PYTHONPATH", str(ROOT / "lib"))
    _submit(tmp_path, "dee", "    while True:\n        pass\n")
    nb_path = tmp_path / "dee" / NOTEBOOK.name
    nb = nbformat.read(str(nb_path), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("goodput([], 1.0, 1.0, (0.0, 1.0))"))
    nbformat.write(nb, str(nb_path))
    rows = grade_notebook(nb_path, "dee", time_limit=4)
    assert rows[-1].case == "TOTAL" and rows[-1].points == 0 and "timed out after 4 s" in rows[-1].note


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
def test_the_build_exercises_are_graded(tmp_path, monkeypatch, stem, stub, body, lost):
    from servelab.exercises.grade import grade_notebook

    monkeypatch.setenv("PYTHONPATH", str(ROOT / "lib"))
    nb = nbformat.read(str(ROOT / "notebooks" / "exercises" / f"{stem}.ipynb"), as_version=4)
    cell = next(c for c in nb.cells if stub in c.source)
    cell.source = cell.source.replace(f"    {stub}", body.strip("\n"))
    nbformat.write(nb, str(tmp_path / f"eve__{stem}.ipynb"))
    rows = grade_notebook(tmp_path / f"eve__{stem}.ipynb", "eve", time_limit=60)
    total = rows[-1]
    assert total.case == "TOTAL" and total.max_points > 0 and not total.note
    assert lost <= {r.case for r in rows[:-1] if r.points < r.max_points}
    assert (total.points == total.max_points) == (not lost)
