"""The CPU variant the clean install runs the notebooks under: the other kernel family and 2 threads.

A checked cell (tag ``nbval-check-output``, or a first line ``# NBVAL_CHECK_OUTPUT``) must print the
same text on every x86-64 CPU a student or CI runs on. torch picks its CPU kernels by the SIMD the
CPU has (``default``, ``avx2``, ``avx512``) and numpy dispatches its loops the same way; the number
of threads changes the order of float reductions (Colab's two cores give torch two threads). A result
that depends on any of these in a digit that is printed fails nbval on some machine.

The committed outputs are executed natively with one thread (``tools/execute_notebooks.py``). The
clean install (``tools/clean_install.py``) compares them against a run with all three causes changed at
once, so one pass over the notebooks checks both the student's install and the CPU independence:

* torch forced to the other kernel family a student's machine may have: ``avx2`` where this CPU has
  AVX-512 (numpy's AVX-512 loops switched off too: an AVX2-only machine), ``default`` where it has
  only AVX2;
* two threads instead of one.

An output that depends on any one cause changes under the combined run unless another cause cancels
that change exactly in every printed digit. :func:`check_forced` fails unless the forced capability is
really in effect in the Python that runs the notebooks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# numpy's dispatch groups above AVX2 (numpy 2.x names); disabling them leaves the AVX2 loops.
NUMPY_ABOVE_AVX2 = ("X86_V4", "AVX512_ICL", "AVX512_SPR")
CAPABILITY = "import torch; print(torch.backends.cpu.get_cpu_capability())"


def _probe(env: dict[str, str], code: str, python: Path | str = sys.executable) -> str:
    out = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def numpy_features_above_avx2() -> list[str]:
    """numpy's dispatch groups above AVX2 that this CPU runs (empty on an AVX2-only CPU)."""
    code = ("from numpy._core._multiarray_umath import __cpu_features__ as f\n"
            f"print(' '.join(k for k in {NUMPY_ABOVE_AVX2!r} if f.get(k)))")
    return _probe(dict(os.environ), code).split()


def native_capability() -> str:
    """The kernel family torch picks on this CPU by itself: ``AVX512``, ``AVX2`` or ``DEFAULT``."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    return _probe(env, CAPABILITY).upper()


def cpu_variant() -> tuple[str, dict[str, str]]:
    """(description, environment overrides) of the combined variant for this CPU."""
    if native_capability() == "AVX512":
        overrides = {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "2"}
        above = numpy_features_above_avx2()
        if above:
            overrides["NPY_DISABLE_CPU_FEATURES"] = " ".join(above)
        return "torch avx2 kernels, numpy without AVX-512, 2 threads", overrides
    return "torch default kernels, 2 threads", {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2"}


def check_forced(env: dict[str, str], python: Path | str = sys.executable) -> None:
    """Fail unless torch, run by ``python`` in ``env``, really runs the capability ``env`` asks for."""
    want = env["ATEN_CPU_CAPABILITY"].upper()
    got = _probe(env, CAPABILITY, python).upper()
    if got != want:
        raise SystemExit(f"ATEN_CPU_CAPABILITY={want.lower()} is not in effect: torch runs {got}")
