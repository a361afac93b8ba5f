"""nbval under a hard deadline (tools/run_nbval.py and the clean install built on it): a notebook that
hangs is killed at its limit, named with its cell and retried once; a retry that passes still warns.

These tests wait out real limits (the hanging notebooks sleep until killed), so they sit in a file of
their own and the test run starts them first (tests/conftest.py): a pytest worker waits here while the
other runs the rest.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat

from runner_notebooks import never_returns, notebook

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import nbrun  # noqa: E402 (tools/nbrun.py)

NBVAL_LIMIT_S = 40  # pytest and nbval start first: under load (two test workers beside other jobs) that took over 15 s


def test_clean_install_retries_a_hang_once_and_warns_when_the_retry_passes(tmp_path, capsys):
    import clean_install

    folder = tmp_path / "nbs"
    folder.mkdir()
    marker = tmp_path / "hung-once"
    flaky = notebook("x = 1", f"import os, time\nif not os.path.exists({str(marker)!r}):\n"
                              f"    open({str(marker)!r}, 'w').close()\n    time.sleep(3600)")
    nbformat.write(flaky, folder / "flaky.ipynb")
    assert clean_install.run_all(folder, Path(sys.executable), dict(os.environ), limit_s=NBVAL_LIMIT_S) == 0
    out = capsys.readouterr().out
    assert "flaky.ipynb: killed after" in out and "at cell 1 (`import os, time`); retrying once" in out
    assert "WARNING (retried):" in out and "flaky.ipynb hung once at cell 1 (`import os, time`); its retry passed" in out
    # A notebook that hangs twice: test_nbval_runner_names_the_hung_cell (the same nbval_notebook).


def test_clean_install_fails_a_notebook_with_an_error_cell(tmp_path, capsys):
    import clean_install

    folder = tmp_path / "nbs"
    folder.mkdir()
    nbformat.write(notebook("x = 1", "raise ValueError('broken on a clean install')"), folder / "broken.ipynb")
    assert clean_install.run_all(folder, Path(sys.executable), dict(os.environ), limit_s=NBVAL_LIMIT_S * 2) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "broken on a clean install" in out


def test_nbval_runner_names_the_hung_cell(tmp_path):
    import run_nbval

    path = tmp_path / "never.ipynb"
    nbformat.write(never_returns(tmp_path / "pid"), path)
    run, warning = run_nbval.nbval_notebook(path, limit_s=NBVAL_LIMIT_S, log=lambda _: None)
    assert run.run.timed_out and not run.ok
    assert run.hung_at == "cell 1 (`import time  # this cell never returns`)"
    assert warning.startswith(f"{path} hung twice")


def test_nbval_runner_retries_a_kernel_that_never_started(tmp_path, monkeypatch):
    """CI's first kernel of a fresh clone once took over nbval's 60 s to answer: that notebook is run
    again (and the retry's result is the notebook's), and a notebook that fails for a real reason is not."""
    import run_nbval

    path = tmp_path / "nb.ipynb"
    calls = []
    replies = iter([nbrun.CommandRun(1, 'RuntimeError("Kernel didn\'t respond in 180 seconds")', 61.0, False),
                    nbrun.CommandRun(0, "== 3 passed in 4.0s ==", 5.0, False)])

    def once(notebook, env, limit_s, where):
        calls.append(notebook)
        return run_nbval.NbvalRun(notebook, next(replies), "")

    monkeypatch.setattr(run_nbval, "nbval_once", once)
    run, warning = run_nbval.nbval_notebook(path, log=lambda _: None)
    assert run.ok and len(calls) == 2
    assert "kernel did not start the first time; the retry passed" in warning

    calls.clear()
    replies = iter([nbrun.CommandRun(1, "AssertionError: 3 != 4", 5.0, False)])
    run, warning = run_nbval.nbval_notebook(path, log=lambda _: None)
    assert not run.ok and len(calls) == 1 and warning == ""


