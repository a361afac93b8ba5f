"""``tools/gpu_check.sh --dry-run``: the prepared GPU check runs its code on the CPU, so it cannot rot
before a GPU is at hand; its JSON fits the schema, and the book's GPU table exists only for real GPU runs."""

import copy
import json
import subprocess
from pathlib import Path

import pytest

from servelab.bench import gpu_results

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dry_result(tmp_path_factory):
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("gpu-check") / "dry.json"
    done = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"saved {out}" in done.stdout
    return out, json.loads(out.read_text())


def test_dry_run_covers_every_part_and_fits_the_schema(dry_result):
    _, result = dry_result
    gpu_results.validate(result)
    assert result["dry_run"] and result["hardware"]["device"] == "cpu" and result["hardware"]["gpu"] is None
    assert result["engine_tests"]["returncode"] == 0 and "passed" in result["engine_tests"]["summary"]
    assert result["benchmark"]["batch1"]["outputs_agree"]
    assert set(result["decode_step"]["models"]) == {"shipped", "smollm2_135m_shape"}
    for model in result["decode_step"]["models"].values():
        for row in model["rows"]:
            assert row["bytes_moved"] > model["weight_bytes"]  # weights plus the KV of the batch
            assert row["kernels"] and row["launch_floor_s"] == pytest.approx(
                row["kernels"] * result["decode_step"]["launch_s"])
    rows = gpu_results.gpu_rows(result)
    assert len(rows) == 5 + sum(len(m["rows"]) for m in result["decode_step"]["models"].values())


def test_validate_rejects_broken_and_cpu_results_posing_as_gpu(dry_result):
    _, result = dry_result
    broken = copy.deepcopy(result)
    del broken["benchmark"]["skewed_64"]
    with pytest.raises(ValueError, match="skewed_64"):
        gpu_results.validate(broken)
    posing = dict(result, dry_run=False)
    with pytest.raises(ValueError, match="CUDA device"):
        gpu_results.validate(posing)


def test_gpu_table_only_from_a_real_gpu_run(dry_result, tmp_path):
    path, _ = dry_result
    assert gpu_results.gpu_table(tmp_path / "absent.json") is None
    with pytest.raises(ValueError, match="dry run"):
        gpu_results.gpu_table(path)


def test_committed_gpu_json_if_any_is_a_real_gpu_run():
    table = gpu_results.gpu_table()  # None until a GPU run commits lib/servelab/data/engine_bench_gpu.json
    assert table is None or "GPU check:" in table.caption
