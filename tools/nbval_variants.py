"""Validate the checked notebook outputs under other CPU kernels and thread counts.

A checked cell (tag ``nbval-check-output``, or a first line ``# NBVAL_CHECK_OUTPUT``) must print the
same text on every x86-64 CPU a student or CI runs on. torch picks its CPU kernels by the SIMD the
CPU has (``default``, ``avx2``, ``avx512``) and numpy dispatches its loops the same way; the number
of threads changes the order of float reductions. A result that depends on any of these in a digit
that is printed fails nbval on some machine. This runs nbval again on every notebook that has a
checked cell, once per variant:

* torch forced to its ``default`` (no SIMD) kernels, with 2 threads;
* torch forced to ``avx2``, numpy's AVX-512 loops switched off (an AVX2-only machine), 1 thread.

``make test-notebooks`` already ran each notebook once natively (AVX-512 kernels where the CPU has
them) with one thread, so together the three runs cover every kernel family and both thread counts;
a fourth run with AVX-512 and 2 threads would add no new combination of causes and cost a third of
the stage. Each variant first
checks that the forced capability is really in effect; each notebook runs in a process of its own
under a hard limit (``run_nbval.py``).

Usage::

    python tools/nbval_variants.py              # every variant this CPU can run
    python tools/nbval_variants.py --list       # the notebooks and variants, nothing run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_nbval import run_nbval  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHECK_TAG = "nbval-check-output"
CHECK_COMMENT = "# NBVAL_CHECK_OUTPUT"
# numpy's dispatch groups above AVX2 (numpy 2.x names); disabling them leaves the AVX2 loops.
NUMPY_ABOVE_AVX2 = ("X86_V4", "AVX512_ICL", "AVX512_SPR")


def has_checked_cell(path: Path) -> bool:
    """Whether the notebook at ``path`` has a cell whose output nbval compares."""
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]).lstrip()
        if CHECK_TAG in cell.get("metadata", {}).get("tags", []) or source.startswith(CHECK_COMMENT):
            return True
    return False


def checked_notebooks(folder: Path = ROOT / "notebooks") -> list[Path]:
    return sorted(p for p in folder.rglob("*.ipynb")
                  if ".ipynb_checkpoints" not in p.parts and has_checked_cell(p))


def _probe(env: dict[str, str], code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def numpy_features_above_avx2() -> list[str]:
    """numpy's dispatch groups above AVX2 that this CPU runs (empty on an AVX2-only CPU)."""
    code = ("from numpy._core._multiarray_umath import __cpu_features__ as f\n"
            f"print(' '.join(k for k in {NUMPY_ABOVE_AVX2!r} if f.get(k)))")
    return _probe(dict(os.environ), code).split()


def variants() -> list[tuple[str, dict[str, str]]]:
    """(name, environment overrides) for every variant this CPU can run."""
    runs = [("torch default kernels, 2 threads", {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2"})]
    avx2 = {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"}
    above = numpy_features_above_avx2()
    if above:
        avx2["NPY_DISABLE_CPU_FEATURES"] = " ".join(above)
    runs.append(("torch avx2 kernels, numpy without AVX-512, 1 thread", avx2))
    return runs


def check_forced(env: dict[str, str]) -> None:
    """Fail unless torch really runs the capability ``env`` asks for."""
    want = env["ATEN_CPU_CAPABILITY"].upper()
    got = _probe(env, "import torch; print(torch.backends.cpu.get_cpu_capability())").upper()
    if got != want:
        raise SystemExit(f"ATEN_CPU_CAPABILITY={want.lower()} is not in effect: torch runs {got}")


def run_variants(runs: list[tuple[str, dict[str, str]]], notebooks: list[Path]) -> list[str]:
    """Run the variants one after the other, each notebook in a process of its own under a hard limit
    (``run_nbval.py``), as many at a time as there are CPU cores; return the names that failed."""
    failed = []
    for name, overrides in runs:
        env = {**os.environ, **overrides}
        check_forced(env)
        print(f"== {name}: {' '.join(f'{k}={v}' for k, v in overrides.items())}", flush=True)
        if not run_nbval(notebooks, env=env, jobs=max(1, min(2, os.cpu_count() or 1)), label=name):
            failed.append(name)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print notebooks and variants, run nothing")
    args = parser.parse_args(argv)
    notebooks = checked_notebooks()
    runs = variants()
    if args.list:
        print("\n".join(str(p.relative_to(ROOT)) for p in notebooks))
        print("\n".join(f"variant: {name} {env}" for name, env in runs))
        return 0
    failed = run_variants(runs, notebooks)
    if failed:
        print(f"checked outputs differ under: {'; '.join(failed)}", file=sys.stderr)
        return 1
    print(f"checked outputs identical under all {len(runs)} variants ({len(notebooks)} notebooks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
