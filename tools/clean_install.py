"""Run every course notebook on a clean install of the library, the way a Colab student gets it.

1. Build a wheel of ``servelab`` from this checkout.
2. Make a fresh virtual environment, install ``torch==2.13.0`` first (the CPU wheel; Colab brings its
   own torch), then the wheel with only the dependencies the package declares, then the notebook
   runtime a Jupyter front end brings (``ipykernel`` 6 as on Colab, ``nbclient``). None of the dev pins.
3. Copy the notebooks into a temporary folder outside the checkout and run each one there with
   nbclient in the fresh environment (``--worker``), so an import that only works inside the
   checkout, a file read by a path relative to it, or a module the package does not declare shows up
   as an error cell.

Every error cell is reported with its notebook and cell number; the exit status is 1 if there is any.

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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"
# The notebook runtime a Jupyter front end brings. Colab's kernel is ipykernel 6; ipykernel 7 can also
# leave nbclient waiting forever for a reply under load.
RUNTIME = ("ipykernel<7", "nbclient")
CELL_TIMEOUT_S = 300


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
    run([str(python), "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"])
    return python


def copy_notebooks(folder: Path) -> list[Path]:
    """The course notebooks, copied (with their sub-folders) under ``folder``."""
    shutil.copytree(ROOT / "notebooks", folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    return sorted(folder.rglob("*.ipynb"))


def error_cells(path: Path) -> list[str]:
    """Run one notebook in its folder (errors kept in the outputs); one line per error cell."""
    from execute_notebooks import execute  # this folder's runner, the one that writes committed outputs

    nb, _, _ = execute(path, CELL_TIMEOUT_S, allow_errors=True)
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                found.append(f"{path.name} cell {index}: {output['ename']}: {output['evalue'][:200]}")
    return found


def worker(folder: Path) -> int:
    """Inside the fresh venv: run every notebook under ``folder`` and report its error cells."""
    import servelab

    if Path(servelab.__file__).resolve().is_relative_to(ROOT):
        raise SystemExit(f"servelab was imported from the checkout ({servelab.__file__}), not the wheel")
    errors = []
    for path in sorted(folder.rglob("*.ipynb")):
        start = time.perf_counter()
        found = error_cells(path)
        print(f"{'FAIL' if found else 'ok':4} {path.relative_to(folder)}  {time.perf_counter() - start:5.1f} s",
              flush=True)
        errors += found
    for line in errors:
        print("  error:", line)
    print(f"{len(errors)} error cell(s) in {len(list(folder.rglob('*.ipynb')))} notebooks on a clean install")
    return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    base = args.keep or Path(tempfile.mkdtemp(prefix="servelab-clean-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        python = fresh_venv(base / "venv", build_wheel(base / "dist"))
        copy_notebooks(base / "notebooks")
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
        env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
        env["JUPYTER_PATH"] = str(base / "venv" / "share" / "jupyter")  # its kernel before any other
        return subprocess.run([str(python), str(Path(__file__).resolve()), "--worker", str(base / "notebooks")],
                              cwd=base, env=env).returncode
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
