"""``make lab``: JupyterLab on the course notebooks, in the project's venv, for a student working locally.

Two things stop a plain ``jupyter-lab`` where students often run it:

* **as root** (the default user of most containers and cloud notebooks) Jupyter refuses to start
  ("Running as root is not recommended. Use --allow-root to bypass."): this adds ``--allow-root``
  when the user id is 0, and only then, and says so;
* **without a browser** (a server, a container) it has nothing to open: this adds ``--no-browser``
  when Python's :mod:`webbrowser` finds none, and says so.

Jupyter prints the URL with its access token when it starts. Any other arguments are passed to
``jupyter-lab`` as they are (``make lab LAB_ARGS="--port 8899"``).

Usage::

    python tools/lab.py [JUPYTER-LAB ARGS...]
    python tools/lab.py --print-command [ARGS...]     # print the command, start nothing
"""

from __future__ import annotations

import os
import shutil
import sys
import webbrowser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def has_browser() -> bool:
    """True if Python's :mod:`webbrowser` can open a page on this machine."""
    try:
        webbrowser.get()
    except webbrowser.Error:
        return False
    return True


def lab_command(args: list[str], uid: int, browser: bool) -> tuple[list[str], list[str]]:
    """(the jupyter-lab command, one line per flag added and why) for user id ``uid``."""
    venv_lab = Path(sys.executable).with_name("jupyter-lab")
    lab = str(venv_lab) if venv_lab.exists() else (shutil.which("jupyter-lab") or "jupyter-lab")
    command, said = [lab, str(ROOT / "notebooks")], []
    if uid == 0 and "--allow-root" not in args:
        command.append("--allow-root")
        said.append("make lab: running as root (uid 0), so JupyterLab gets --allow-root")
    if not browser and "--no-browser" not in args:
        command.append("--no-browser")
        said.append("make lab: no web browser found here, so JupyterLab gets --no-browser; "
                    "open the URL it prints (with its token) in a browser that reaches this machine")
    return command + args, said


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    dry = "--print-command" in args
    args = [a for a in args if a != "--print-command"]
    command, said = lab_command(args, os.geteuid(), has_browser())
    for line in said:
        print(line, flush=True)
    if dry:
        print(" ".join(command))
        return 0
    os.execv(command[0], command)  # the server keeps this process id: stopping it stops the lab


if __name__ == "__main__":
    sys.exit(main())
