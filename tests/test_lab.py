"""``make lab`` (tools/lab.py): --allow-root only as root, --no-browser without a browser, and a lab
that really serves the notebooks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import lab  # noqa: E402


def test_allow_root_only_as_root():
    as_root, said = lab.lab_command([], uid=0, browser=True)
    assert "--allow-root" in as_root and any("root" in line for line in said)
    as_user, said = lab.lab_command([], uid=1000, browser=True)
    assert "--allow-root" not in as_user and not said


def test_no_browser_only_without_one_and_user_flags_pass_through():
    headless, said = lab.lab_command(["--port", "8899"], uid=1000, browser=False)
    assert "--no-browser" in headless and headless[-2:] == ["--port", "8899"]
    assert any("URL" in line for line in said)
    with_browser, _ = lab.lab_command([], uid=1000, browser=True)
    assert "--no-browser" not in with_browser
    twice, _ = lab.lab_command(["--no-browser"], uid=0, browser=False)
    assert twice.count("--no-browser") == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_lab_serves_the_notebooks():
    """The lab target's command, started for a few seconds on a free port as the current user: its
    contents API lists the course notebooks; then it is stopped by its pid."""
    port, token = free_port(), "servelab-test-token"
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / "lab.py"), "--no-browser", "--ip", "127.0.0.1",
                             "--port", str(port), f"--IdentityProvider.token={token}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        listing, deadline = None, time.monotonic() + 90
        while listing is None and time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"jupyter-lab exited {proc.returncode}: {proc.stdout.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token={token}",
                                            timeout=5) as reply:
                    listing = json.load(reply)
            except OSError:
                time.sleep(0.5)
        assert listing is not None, "the lab never answered on its port"
        names = {entry["name"] for entry in listing["content"]}
        assert "ch00-state-machine.ipynb" in names and "exercises" in names
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode is not None
