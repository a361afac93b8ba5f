"""One machine profile per build: measured once, stored, read by every notebook."""

import json

import pytest

from servelab.bench import machine
from servelab.bench.machine import (FROM_BUILD, MEASURED_HERE, PROFILE_ENV, MachineProfile, machine_profile,
                                    measure_profile, read_profile, write_profile)


def _profile(**changes) -> MachineProfile:
    values = dict(cpu="Test CPU", flags=("avx2", "avx512f"), kernel_family="AVX512", threads=1, cores=2,
                  read_bandwidth=20e9, peak_flops={"float32": 100e9, "bfloat16": 50e9}, op_overhead_s=2e-6,
                  load_average=(1.0, 0.5, 0.25), torch_version="2.x", measured_at="2026-01-01 00:00")
    return MachineProfile(**(values | changes))


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    monkeypatch.setattr(machine, "_PROCESS_PROFILE", [])


def test_bf16_native_follows_the_flags():
    assert not _profile().bf16_native
    assert "no bf16 instructions" in _profile().bf16_sentence()
    for flag in ("avx512_bf16", "amx_bf16"):
        profile = _profile(flags=("avx2", flag), peak_flops={"float32": 100e9, "bfloat16": 460e9})
        assert profile.bf16_native
        assert profile.bf16_sentence().startswith(f"bf16 matmuls run natively here ({flag}): 4.60×")


def test_roundtrip_through_json(tmp_path):
    path = tmp_path / "profile.json"
    write_profile(_profile(), path)
    stored = json.loads(path.read_text())
    assert stored["ridge_point_flop_per_byte"] == pytest.approx(5.0)
    back = read_profile(path)
    assert back == _profile() and back.source == FROM_BUILD
    assert back.roofline().ridge_point() == pytest.approx(5.0)


def test_incomplete_file_is_refused(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"cpu": "x"}))
    with pytest.raises(ValueError, match="missing"):
        read_profile(path)


def test_build_file_is_read_not_measured(tmp_path, monkeypatch):
    import torch

    path = tmp_path / "profile.json"
    write_profile(_profile(kernel_family=torch.backends.cpu.get_cpu_capability()), path)
    monkeypatch.setenv(PROFILE_ENV, str(path))
    monkeypatch.setattr(machine, "measure_profile", lambda: pytest.fail("measured again"))
    first = machine_profile()
    assert first.cpu == "Test CPU" and first.source == FROM_BUILD
    assert machine_profile() is first


def test_named_but_missing_file_is_measured_into(tmp_path, monkeypatch):
    path = tmp_path / "build" / "profile.json"
    monkeypatch.setenv(PROFILE_ENV, str(path))
    monkeypatch.setattr(machine, "measure_profile", lambda: _profile())
    assert machine_profile().source == FROM_BUILD
    assert read_profile(path).cpu == "Test CPU"


def test_alone_measures_once_per_process_and_says_so(monkeypatch):
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    calls = []
    monkeypatch.setattr(machine, "measure_profile", lambda: calls.append(1) or _profile())
    assert machine_profile().source == MEASURED_HERE
    machine_profile()
    assert calls == [1]


def test_other_kernel_family_is_measured_again(tmp_path, monkeypatch):
    path = tmp_path / "profile.json"
    write_profile(_profile(kernel_family="NO SUCH FAMILY"), path)
    monkeypatch.setenv(PROFILE_ENV, str(path))
    monkeypatch.setattr(machine, "measure_profile", lambda: _profile(cpu="measured"))
    assert machine_profile().cpu == "measured"


def test_measure_profile_is_real_and_restores_threads():
    import torch

    before = torch.get_num_threads()
    profile = measure_profile(budget_s=0.02, bandwidth_bytes=8 << 20, matmul_size=64)
    assert torch.get_num_threads() == before
    assert profile.threads == 1 and profile.read_bandwidth > 0 and profile.op_overhead_s > 0
    assert set(profile.peak_flops) == {"float32", "bfloat16"}
    assert len(profile.rows()) >= 10
    with pytest.raises(ValueError, match="threads"):
        measure_profile(threads=0)
