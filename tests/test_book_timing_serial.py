"""The book build runs notebooks that time things alone: after every other notebook, one at a time."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import servelab_book  # noqa: E402


def _notebook(path: Path, timing: bool) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"# {path.stem}")])
    if timing:
        nb.metadata["servelab"] = {"timing": True}
    nbformat.write(nb, path)
    return path


def test_timing_notebooks_never_overlap_another(tmp_path, monkeypatch):
    paths = [_notebook(tmp_path / f"shared{i}.ipynb", False) for i in range(3)]
    paths += [_notebook(tmp_path / f"timing{i}.ipynb", True) for i in range(2)]
    spans: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()

    def fake_run(nb, cwd, timeout, allow_errors):
        start = time.perf_counter()
        time.sleep(0.05)
        with lock:
            spans[nb.cells[0].source] = (start, time.perf_counter())

    monkeypatch.setattr(servelab_book, "_run_with_deadline", fake_run)
    monkeypatch.setenv(servelab_book.BOOK_JOBS_ENV, "2")
    config = SimpleNamespace(execution_in_temp=False, execution_mode="force", execution_timeout=30,
                             execution_allow_errors=False)
    env = SimpleNamespace(mystnb_config=config, doc2path=lambda name: str(tmp_path / f"{name}.ipynb"))
    app = SimpleNamespace(env=env)
    try:
        servelab_book.prefetch_notebooks(app, env, [p.stem for p in paths])
        for future in list(servelab_book.PREFETCHED.values()):
            future.result(timeout=10)
    finally:
        servelab_book.stop_prefetching(app, None)
    assert len(spans) == 5
    for name, (start, end) in spans.items():
        if name.startswith("# timing"):
            others = [s for n, s in spans.items() if n != name]
            assert all(end <= o_start or o_end <= start for o_start, o_end in others), name


@pytest.mark.parametrize("metadata, expected", [({}, False), ({"servelab": {"timing": True}}, True),
                                                ({"servelab": {}}, False)])
def test_timing_mark_is_read_from_metadata(metadata, expected):
    nb = nbformat.v4.new_notebook()
    nb.metadata.update(metadata)
    assert servelab_book.is_timing_notebook(nb) is expected


def test_the_profile_is_measured_once_per_build_and_named_for_the_kernels(tmp_path, monkeypatch):
    from servelab.bench.machine import PROFILE_ENV

    cache = tmp_path / "_build" / ".jupyter_cache"
    app = SimpleNamespace(env=SimpleNamespace(mystnb_config=SimpleNamespace(execution_cache_path=str(cache))))
    calls = []

    def fake_measure(cmd, check):
        calls.append(cmd)
        Path(cmd[-1]).parent.mkdir(parents=True, exist_ok=True)
        Path(cmd[-1]).write_text("{}")

    monkeypatch.setattr("subprocess.run", fake_measure)
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    servelab_book.measure_machine_once(app, app.env, [])
    servelab_book.measure_machine_once(app, app.env, [])  # the build's profile exists: kept
    path = tmp_path / "_build" / "machine-profile.json"
    assert os.environ[PROFILE_ENV] == str(path.resolve())
    assert len(calls) == 1 and calls[0][1:] == ["-m", "servelab.bench.machine", str(path.resolve())]
