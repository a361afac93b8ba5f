"""The CPU variant the clean install runs the notebooks under: another kernel family and 2 threads.

A checked cell (tag ``nbval-check-output``, or a first line ``# NBVAL_CHECK_OUTPUT``) must print the
same text on every CPU a student or CI runs on. torch picks its CPU kernels by the SIMD the CPU has
(``default``, ``avx2``, ``avx512``) and numpy dispatches its loops the same way; the number of threads
changes the order of float reductions (Colab's two cores give torch two threads). A result that
depends on any of these in a digit that is printed fails nbval on some machine.

The committed outputs are executed natively with one thread (``tools/execute_notebooks.py``). The
clean install (``tools/clean_install.py``) compares them against a run with these causes changed at
once, so one pass over the notebooks checks both the student's install and the CPU independence:

* torch forced to the other kernel family a student's machine may have: ``avx2`` where this CPU runs
  AVX-512 (numpy's AVX-512 loops switched off too: an AVX2-only machine), ``default`` where it runs
  only AVX2;
* two threads instead of one.

Not every CPU lets torch be forced. On a CPU with AMX (Sapphire Rapids class Xeons),
torch 2.13's bfloat16 attention picks its VNNI-packing path from the CPU's own features, and then
refuses a forced lower capability (``RuntimeError: pack_vnni2 is only supported when avx512 is
supported``). A CPU that is not x86-64 has no other x86 family to force. There torch's kernels stay
native, the other causes still change, and the variant says so in its note (:func:`choose_variant`).
:func:`probe_error` then runs torch's float32 and bfloat16 paths under the chosen environment;
:func:`runnable_variant` falls back to native kernels, with the error in the note, if they fail.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

# numpy's dispatch groups above AVX2 (numpy 2.x names); disabling them leaves the AVX2 loops.
NUMPY_ABOVE_AVX2 = ("X86_V4", "AVX512_ICL", "AVX512_SPR")
CAPABILITY = "import torch; print(torch.backends.cpu.get_cpu_capability())"
X86 = ("x86_64", "amd64", "i686", "i386")
# CPU flags under which torch's bf16 attention packs for AMX and refuses a forced capability below
# AVX-512. AVX512-BF16 alone does not: an AMD EPYC with avx512_bf16 and no AMX ran the probe under
# a forced avx2 and default.
AMX_FLAGS = ("amx_bf16", "amx_tile")
TWO_THREADS = {"OMP_NUM_THREADS": "2"}

PROBE = """import torch, torch.nn.functional as F
g = torch.Generator().manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    a = torch.randn(64, 64, generator=g).to(dtype)
    (a @ a).sum()
    q = torch.randn(1, 4, 16, 32, generator=g).to(dtype)           # a prefill: 16 query tokens
    k = torch.randn(1, 2, 16, 32, generator=g).to(dtype)
    F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
    q1 = torch.randn(3, 2, 2, 32, generator=g).to(dtype)           # a decode batch, grouped heads
    k1 = torch.randn(3, 2, 24, 32, generator=g).to(dtype)
    mask = torch.ones(3, 1, 1, 24, dtype=torch.bool)
    F.scaled_dot_product_attention(q1, k1, k1, attn_mask=mask)
print("ok")"""
"""The float32 and bfloat16 matmul and attention calls the notebooks make (prefill with grouped-query
heads, masked batched decode), at small shapes."""


@dataclass(frozen=True)
class CpuDescription:
    """What decides the variant: the architecture, the CPU's flags and torch's own kernel family."""

    machine: str
    flags: frozenset[str]
    native: str  # torch.backends.cpu.get_cpu_capability(), upper case
    numpy_above_avx2: tuple[str, ...] = ()


@dataclass(frozen=True)
class Variant:
    """The environment the notebooks run under, one line that says what it changes, and a note that
    says why torch's kernels stay native ('' when they are forced)."""

    description: str
    overrides: dict[str, str] = field(default_factory=dict)
    note: str = ""

    @property
    def forced(self) -> str:
        """The capability forced on torch, or '' when its kernels stay native."""
        return self.overrides.get("ATEN_CPU_CAPABILITY", "")

    def banner(self) -> str:
        """The line the clean install prints before it runs the notebooks."""
        settings = " ".join(f"{k}={v}" for k, v in self.overrides.items())
        line = f"== notebooks under the CPU variant: {self.description} ({settings})"
        return f"{line}\n== note: {self.note}" if self.note else line


def _numpy_off(cpu: CpuDescription) -> dict[str, str]:
    return {"NPY_DISABLE_CPU_FEATURES": " ".join(cpu.numpy_above_avx2)} if cpu.numpy_above_avx2 else {}


def choose_variant(cpu: CpuDescription) -> Variant:
    """The variant for ``cpu``: the other x86 kernel family where torch can run it, else native kernels
    with a note naming why."""
    if cpu.machine.lower() not in X86:
        return Variant("torch native kernels, 2 threads", dict(TWO_THREADS),
                       f"torch's kernels stay native: a {cpu.machine} CPU has no other x86 kernel "
                       "family to force; the run still changes the thread count")
    if cpu.native == "AVX512":
        numpy_off = _numpy_off(cpu)
        bf16 = sorted(cpu.flags.intersection(AMX_FLAGS))
        if bf16:
            return Variant("torch native AVX-512 kernels, numpy without AVX-512, 2 threads",
                           {**TWO_THREADS, **numpy_off},
                           f"torch's kernels stay native: this CPU has {', '.join(bf16)}, and torch's "
                           "bfloat16 attention refuses a forced avx2 capability there (pack_vnni2)")
        return Variant("torch avx2 kernels, numpy without AVX-512, 2 threads",
                       {"ATEN_CPU_CAPABILITY": "avx2", **TWO_THREADS, **numpy_off})
    if cpu.native == "AVX2":
        return Variant("torch default kernels, 2 threads",
                       {"ATEN_CPU_CAPABILITY": "default", **TWO_THREADS})
    return Variant("torch native kernels, 2 threads", dict(TWO_THREADS),
                   f"torch's kernels stay native: torch already runs its {cpu.native} family here, "
                   "the lowest there is; the run still changes the thread count")


def _probe(env: dict[str, str], code: str, python: Path | str = sys.executable) -> str:
    out = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def cpu_flags() -> frozenset[str]:
    """The flags of the first CPU in ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def numpy_features_above_avx2() -> tuple[str, ...]:
    """numpy's dispatch groups above AVX2 that this CPU runs (empty on an AVX2-only CPU)."""
    code = ("from numpy._core._multiarray_umath import __cpu_features__ as f\n"
            f"print(' '.join(k for k in {NUMPY_ABOVE_AVX2!r} if f.get(k)))")
    return tuple(_probe(dict(os.environ), code).split())


def native_capability() -> str:
    """The kernel family torch picks on this CPU by itself: ``AVX512``, ``AVX2`` or ``DEFAULT``."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    return _probe(env, CAPABILITY).upper()


def this_cpu() -> CpuDescription:
    """This machine's description, as :func:`choose_variant` reads it."""
    x86 = platform.machine().lower() in X86
    return CpuDescription(platform.machine(), cpu_flags(), native_capability(),
                          numpy_features_above_avx2() if x86 else ())


def probe_error(env: dict[str, str], python: Path | str = sys.executable) -> str:
    """'' if torch runs the notebooks' float32 and bfloat16 paths (:data:`PROBE`) under ``env``, else
    the last line of the error it raised."""
    done = subprocess.run([str(python), "-c", PROBE], env=env, capture_output=True, text=True)
    if done.returncode == 0 and done.stdout.strip().endswith("ok"):
        return ""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {done.returncode}"


def runnable_variant(variant: Variant, env: dict[str, str],
                     python: Path | str = sys.executable) -> Variant:
    """``variant`` if torch runs the probe under it; else the same without the forced capability,
    its note naming the refusal."""
    if not variant.forced:
        return variant
    error = probe_error({**env, **variant.overrides}, python)
    if not error:
        return variant
    overrides = {k: v for k, v in variant.overrides.items() if k != "ATEN_CPU_CAPABILITY"}
    return replace(variant, description=f"torch native kernels ({variant.description} refused)",
                   overrides=overrides,
                   note=f"torch's kernels stay native: forcing {variant.forced} failed the probe: {error}")


def check_forced(env: dict[str, str], python: Path | str = sys.executable) -> None:
    """Fail unless torch, run by ``python`` in ``env``, really runs the capability ``env`` asks for
    (nothing to check when ``env`` forces none)."""
    if "ATEN_CPU_CAPABILITY" not in env:
        return
    want = env["ATEN_CPU_CAPABILITY"].upper()
    got = _probe(env, CAPABILITY, python).upper()
    if got != want:
        raise SystemExit(f"ATEN_CPU_CAPABILITY={want.lower()} is not in effect: torch runs {got}")
