"""tools/cpu_variant.py: a variant that torch can run on every CPU description, or a note naming why not."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import cpu_variant  # noqa: E402
from cpu_variant import CpuDescription, Variant, choose_variant  # noqa: E402

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
SAPPHIRE_RAPIDS = AVX512 | {"avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8", "amx_tile"}
NUMPY_AVX512 = ("X86_V4", "AVX512_ICL", "AVX512_SPR")


def test_avx2_only_cpu_is_forced_to_the_default_family():
    v = choose_variant(CpuDescription("x86_64", AVX2, "AVX2"))
    assert v.forced == "default" and v.overrides["OMP_NUM_THREADS"] == "2" and not v.note


def test_avx512_without_bf16_is_forced_to_avx2_with_numpy_at_avx2():
    v = choose_variant(CpuDescription("x86_64", AVX512, "AVX512", NUMPY_AVX512))
    assert v.forced == "avx2"
    assert v.overrides["NPY_DISABLE_CPU_FEATURES"] == " ".join(NUMPY_AVX512)
    assert not v.note


def test_avx512_bf16_without_amx_is_still_forced_to_avx2():
    """An AMD EPYC (Zen 4) has avx512_bf16 and no AMX; torch runs its bf16 attention forced to avx2."""
    v = choose_variant(CpuDescription("x86_64", AVX512 | {"avx512_bf16"}, "AVX512", NUMPY_AVX512))
    assert v.forced == "avx2" and not v.note


def test_amx_cpu_keeps_torch_native_and_says_why():
    v = choose_variant(CpuDescription("x86_64", SAPPHIRE_RAPIDS, "AVX512", NUMPY_AVX512))
    assert v.forced == ""                                   # the combination torch refuses is never made
    assert v.overrides["OMP_NUM_THREADS"] == "2"            # the other causes still change
    assert "NPY_DISABLE_CPU_FEATURES" in v.overrides
    assert "amx_bf16" in v.note and "pack_vnni2" in v.note
    assert "note:" in v.banner()


@pytest.mark.parametrize("machine, native", [("aarch64", "DEFAULT"), ("arm64", "SVE256"),
                                             ("ppc64le", "VSX")])
def test_other_architectures_get_no_forced_family_and_a_note(machine, native):
    v = choose_variant(CpuDescription(machine, frozenset({"fp", "asimd"}), native))
    assert v.forced == "" and v.overrides == {"OMP_NUM_THREADS": "2"}
    assert machine in v.note


def test_x86_already_at_the_lowest_family_gets_a_note():
    v = choose_variant(CpuDescription("x86_64", frozenset({"sse4_2"}), "DEFAULT"))
    assert v.forced == "" and "DEFAULT" in v.note


def test_a_refused_forced_variant_falls_back_to_native_with_the_error(monkeypatch):
    refusal = "RuntimeError: pack_vnni2 is only supported when avx512 is supported"
    monkeypatch.setattr(cpu_variant, "probe_error", lambda env, python=sys.executable: refusal)
    forced = Variant("torch avx2 kernels, 2 threads", {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "2"})
    v = cpu_variant.runnable_variant(forced, dict(os.environ))
    assert v.forced == "" and v.overrides == {"OMP_NUM_THREADS": "2"}
    assert refusal in v.note and "refused" in v.description


def test_this_cpu_gets_a_variant_that_torch_runs():
    """On whatever CPU runs the tests: the chosen variant passes the probe (float32 and bfloat16
    matmul and attention), and a forced family is really in effect and differs from the native one."""
    cpu = cpu_variant.this_cpu()
    v = cpu_variant.runnable_variant(choose_variant(cpu), dict(os.environ))
    env = {**os.environ, **v.overrides}
    assert cpu_variant.probe_error(env) == ""
    cpu_variant.check_forced(env)
    if v.forced:
        assert v.forced.upper() != cpu.native
    else:
        assert v.note
