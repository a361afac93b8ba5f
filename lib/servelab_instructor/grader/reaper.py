"""No process a submission starts outlives its grading.

:func:`reaping` makes the grader a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a
process that a worker starts and leaves behind, even one that called ``setsid`` or double-forked, is
re-parented to the grader instead of to init. :func:`sweep` then kills every child of the grader
that was not there before grading began and is not a live worker, until none is left. Elsewhere
(no ``prctl``) only the workers' own sessions are killed, which a ``setsid`` escapes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["children", "hide_process_state", "reaping", "sweep"]

_PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 4, 36, 37


def _prctl() -> object | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (AttributeError, OSError):
        return None


def hide_process_state() -> bool:
    """Make this process non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``): its ``/proc`` environment and
    memory are then unreadable to other processes of the same (non-root) user, so a submission
    cannot read ``SERVELAB_GRADE_SEED`` there. Its command line stays readable. False where there is
    no prctl."""
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def children() -> set[int]:
    """Process ids whose parent is this process (read from ``/proc``; empty where there is none)."""
    me, found = os.getpid(), set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            found.add(int(entry))
    return found


def sweep(keep: set[int], rounds: int = 200) -> int:
    """SIGKILL and reap every child not in ``keep`` until none is left; returns how many were
    killed."""
    killed = 0
    for _ in range(rounds):
        targets = children() - keep
        if not targets:
            return killed
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        for pid in targets:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        time.sleep(0.01)  # an orphan is re-parented to us only once its parent is gone
    return killed


@contextmanager
def reaping() -> Iterator[set[int]]:
    """Be a child subreaper inside the block; yields the children that existed before (never
    killed)."""
    prctl = _prctl()
    before = children()
    previous = ctypes.c_int(0)
    if prctl is not None:
        prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0)
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield before
    finally:
        sweep(before)
        if prctl is not None:
            prctl(_PR_SET_CHILD_SUBREAPER, previous.value, 0, 0, 0)
