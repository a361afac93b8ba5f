"""Validate the checked notebook outputs under other CPU kernels and thread counts.

A checked cell (tag ``nbval-check-output``, or a first line ``# NBVAL_CHECK_OUTPUT``) must print the
same text on every x86-64 CPU a student or CI runs on. torch picks its CPU kernels by the SIMD the
CPU has (``default``, ``avx2``, ``avx512``) and numpy dispatches its loops the same way; the number
of threads changes the order of float reductions (Colab's two cores give torch two threads). A result
that depends on any of these in a digit that is printed fails nbval on some machine.

The clean-install stage already ran every notebook natively, with this CPU's own kernels and one
thread. This runs nbval once more on every notebook that has a checked cell, with all three causes
changed at once:

* torch forced to the other kernel family a student's machine may have: ``avx2`` where this CPU has
  AVX-512 (numpy's AVX-512 loops switched off too: an AVX2-only machine), ``default`` where it has
  only AVX2;
* two threads instead of one.

An output that depends on any one cause changes under the combined run unless another cause cancels
that change exactly in every printed digit; one combined run costs half of one run per cause. The
variant first checks that the forced capability is really in effect. Each notebook runs from a copy
cut after its last checked cell (nothing later can change a checked output), in a process of its own
under a hard limit (``run_nbval.py``).

Usage::

    python tools/nbval_variants.py              # the variant for this CPU
    python tools/nbval_variants.py --list       # the notebooks and the variant, nothing run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_nbval import Interpreter, run_nbval  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHECK_TAG = "nbval-check-output"
CHECK_COMMENT = "# NBVAL_CHECK_OUTPUT"
# numpy's dispatch groups above AVX2 (numpy 2.x names); disabling them leaves the AVX2 loops.
NUMPY_ABOVE_AVX2 = ("X86_V4", "AVX512_ICL", "AVX512_SPR")


def is_checked(cell: dict) -> bool:
    """Whether nbval compares this cell's output."""
    if cell["cell_type"] != "code":
        return False
    source = "".join(cell["source"]).lstrip()
    return CHECK_TAG in cell.get("metadata", {}).get("tags", []) or source.startswith(CHECK_COMMENT)


def has_checked_cell(path: Path) -> bool:
    """Whether the notebook at ``path`` has a cell whose output nbval compares."""
    return any(is_checked(cell) for cell in json.loads(path.read_text())["cells"])


def checked_notebooks(folder: Path = ROOT / "notebooks") -> list[Path]:
    return sorted(p for p in folder.rglob("*.ipynb")
                  if ".ipynb_checkpoints" not in p.parts and has_checked_cell(p))


def up_to_last_checked(path: Path) -> None:
    """Cut the notebook at ``path`` after its last checked cell: what runs later cannot change a
    checked output, and §7's last half (real-model timings) is most of its run time."""
    nb = json.loads(path.read_text())
    last = max(index for index, cell in enumerate(nb["cells"]) if is_checked(cell))
    nb["cells"] = nb["cells"][:last + 1]
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def truncated_copies(notebooks: list[Path], folder: Path) -> list[Path]:
    """The notebooks copied under ``folder/notebooks`` (the book's pages beside them, which the course
    plan reads) and each cut after its last checked cell; returns the copies of ``notebooks``."""
    shutil.copytree(ROOT / "notebooks", folder / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    shutil.copytree(ROOT / "book", folder / "book", ignore=shutil.ignore_patterns("_build"))
    copies = [folder / path.relative_to(ROOT) for path in notebooks]
    for copy in copies:
        up_to_last_checked(copy)
    return copies


def _probe(env: dict[str, str], code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def numpy_features_above_avx2() -> list[str]:
    """numpy's dispatch groups above AVX2 that this CPU runs (empty on an AVX2-only CPU)."""
    code = ("from numpy._core._multiarray_umath import __cpu_features__ as f\n"
            f"print(' '.join(k for k in {NUMPY_ABOVE_AVX2!r} if f.get(k)))")
    return _probe(dict(os.environ), code).split()


def native_capability() -> str:
    """The kernel family torch picks on this CPU by itself: ``AVX512``, ``AVX2`` or ``DEFAULT``."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    return _probe(env, "import torch; print(torch.backends.cpu.get_cpu_capability())").upper()


def variants() -> list[tuple[str, dict[str, str]]]:
    """(name, environment overrides) of the one combined variant for this CPU."""
    if native_capability() == "AVX512":
        overrides = {"ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "2"}
        above = numpy_features_above_avx2()
        if above:
            overrides["NPY_DISABLE_CPU_FEATURES"] = " ".join(above)
        return [("torch avx2 kernels, numpy without AVX-512, 2 threads", overrides)]
    return [("torch default kernels, 2 threads", {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "2"})]


def check_forced(env: dict[str, str]) -> None:
    """Fail unless torch really runs the capability ``env`` asks for."""
    want = env["ATEN_CPU_CAPABILITY"].upper()
    got = _probe(env, "import torch; print(torch.backends.cpu.get_cpu_capability())").upper()
    if got != want:
        raise SystemExit(f"ATEN_CPU_CAPABILITY={want.lower()} is not in effect: torch runs {got}")


def run_variants(runs: list[tuple[str, dict[str, str]]], notebooks: list[Path]) -> list[str]:
    """Run the variants one after the other on copies of the notebooks cut after their last checked
    cell, each notebook in a process of its own under a hard limit (``run_nbval.py``), as many at a
    time as there are CPU cores; return the names that failed."""
    failed = []
    with tempfile.TemporaryDirectory(prefix="servelab-variants-") as tmp:
        copies = truncated_copies(notebooks, Path(tmp))
        for name, overrides in runs:
            env = {**os.environ, **overrides}
            check_forced(env)
            print(f"== {name}: {' '.join(f'{k}={v}' for k, v in overrides.items())}", flush=True)
            if not run_nbval(copies, env=env, jobs=max(1, min(2, os.cpu_count() or 1)), label=name,
                             where=Interpreter(cwd=Path(tmp))):
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
    print(f"checked outputs identical under {'; '.join(name for name, _ in runs)} ({len(notebooks)} notebooks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
