"""Small notebooks for the runner tests: one built from cell sources, one whose second cell never
returns (its kernel writes its pid first, so a test can check that the kernel died with the run)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat


def notebook(*sources: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    return nb


def never_returns(pid_file: Path) -> nbformat.NotebookNode:
    return notebook(f"import os\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))",
                    "import time  # this cell never returns\nwhile True:\n    time.sleep(0.2)",
                    "print('unreachable')")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def wait_dead(pid: int, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


