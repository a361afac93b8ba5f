"""How a grading worker is kept away from everything but its own scratch folder.

Three levels, the first one available is used (:func:`choose`):

* ``bubblewrap`` -- the worker runs under ``bwrap`` (Debian/Ubuntu package ``bubblewrap``) in new
  PID, mount, network, IPC and UTS namespaces: it sees only read-only copies of the interpreter, the
  virtual environment and the system libraries, a private size-capped tmpfs as its working folder,
  its own processes only (it cannot signal or even see the grader), and no network but an empty
  loopback. As root, the worker then drops to a uid of its own (no capabilities), so
  ``RLIMIT_NPROC`` caps its processes; as another user, a user namespace maps it and the process cap
  counts that user's processes plus a margin.
* ``separate uid`` -- where namespaces are refused (a container without ``CAP_SYS_ADMIN`` or without
  user namespaces) but the grader runs as root: the worker drops to a uid of its own in a private
  folder. It cannot signal the grader or write the instructor's files, but it can read
  world-readable files and open network connections.
* ``none`` -- neither: the grader refuses to run student code (:class:`IsolationUnavailable`) unless
  the caller passes ``unsafe=True`` (``--unsafe`` on the command line), which prints the risk.

System boundary: this module builds the worker's command line and picks its uid and limits; the
worker itself (:mod:`servelab_instructor.grader._worker`) drops the uid, applies the limits and
reports the operations it refuses.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import os
import shutil
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BUBBLEWRAP", "NONE", "SEPARATE_UID", "Isolation", "IsolationUnavailable", "choose"]

BUBBLEWRAP, SEPARATE_UID, NONE = "bubblewrap", "separate uid", "none"
SCRATCH = "/scratch"  # the worker's working folder inside the sandbox (its TMPDIR and HOME too)
_FIRST_UID = 61000  # the workers' uids as root: one of its own per worker, from this range
_UID_RANGE = 4000
_NPROC = 128  # processes and threads a worker may run (as root: its own uid's; else a margin)
_uids = itertools.count()
_uid_lock = threading.Lock()
RISK = (
    "student code would run as the grader's user, with its rights: it could kill or stop the "
    "grader, read and rewrite other students' submissions and the grade sheet, and open network "
    "connections"
)


class IsolationUnavailable(RuntimeError):
    """Neither bubblewrap nor a separate uid is available, and unsafe grading was not asked for."""


@dataclass(frozen=True)
class Isolation:
    """The isolation in use: ``kind`` is one of BUBBLEWRAP, SEPARATE_UID, NONE."""

    kind: str
    bwrap: str | None = None
    scratch_bytes: int = 64 * 2**20

    @property
    def as_root(self) -> bool:
        return os.geteuid() == 0

    def next_uid(self) -> int | None:
        """A uid no other live worker has (as root), or None (the worker keeps the grader's)."""
        if self.kind == NONE or not self.as_root:
            return None
        with _uid_lock:
            return _FIRST_UID + next(_uids) % _UID_RANGE

    def process_limit(self) -> int:
        """RLIMIT_NPROC for a worker: its own uid's processes as root, else this user's now plus a
        margin."""
        return _NPROC if self.as_root else _user_tasks() + _NPROC

    def command(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """``argv`` wrapped for this isolation (unchanged without bubblewrap)."""
        if self.kind != BUBBLEWRAP:
            return argv
        return [
            self.bwrap,
            *_namespaces(self.as_root),
            *_mounts(self.scratch_bytes),
            "--chdir",
            SCRATCH,
            "--clearenv",
            *[a for k, v in env.items() for a in ("--setenv", k, v)],
            "--",
            *argv,
        ]

    def describe(self) -> str:
        """One line for the instructor: what protects the grader from the submissions."""
        if self.kind == BUBBLEWRAP:
            return (
                "isolation: bubblewrap (own PID, mount and network namespaces, read-only system, "
                f"{self.scratch_bytes >> 20} MiB scratch tmpfs"
                f"{', a uid of its own per worker' if self.as_root else ''})"
            )
        if self.kind == SEPARATE_UID:
            exposed = _readable_references()
            return (
                "isolation: a separate uid per worker (bubblewrap unavailable: workers can read "
                "world-readable files and open network connections)"
                + (
                    f"; WARNING: other users can read the reference solutions: chmod -R "
                    f"go-rwx {exposed}"
                    if exposed
                    else ""
                )
            )
        return f"WARNING: no isolation (--unsafe): {RISK}"


def _namespaces(as_root: bool) -> list[str]:
    common = [
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
    ]
    if as_root:  # the worker drops to its own uid itself; these two capabilities let it
        return [*common, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return [*common, "--unshare-user", "--uid", "65534", "--gid", "65534"]


def _read_only_roots() -> list[str]:
    """The folders the interpreter needs: the system's ``/usr``, the venv, the base installation."""
    roots = {"/usr", sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    roots |= {
        os.path.realpath(p) for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)
    }
    kept: list[str] = []
    for root in sorted(roots, key=len):
        if os.path.isdir(root) and not any(
            root == k or root.startswith(k.rstrip("/") + "/") for k in kept
        ):
            kept.append(root)
    return kept


def _mounts(scratch_bytes: int) -> list[str]:
    args: list[str] = []
    made: set[str] = set()
    for top in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
        path = Path("/") / top
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir() and not str(path).startswith("/usr"):
            args += ["--ro-bind", str(path), str(path)]
    for root in _read_only_roots():
        for parent in reversed(Path(root).parents[:-1]):  # bwrap would make them 0700
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", root, root]
    if os.path.exists("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return [*args, "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(scratch_bytes), "--tmpfs", SCRATCH]


def _readable_references() -> str | None:
    """The instructor package's folder when other users can read a file in it, else None."""
    spec = importlib.util.find_spec("servelab_instructor")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    exposed = any(p.stat().st_mode & stat.S_IROTH for p in folder.rglob("*.py"))
    return str(folder) if exposed else None


def _user_tasks() -> int:
    """Processes and threads of this process's real uid now (what RLIMIT_NPROC counts)."""
    uid, total = os.getuid(), 0
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields.get("Uid", "-1").split()[0]) == uid:
                total += int(fields.get("Threads", "1"))
    return total


@functools.cache
def _bwrap_works(bwrap: str) -> bool:
    """Start a trivial sandbox the way a worker's is started."""
    probe = Isolation(BUBBLEWRAP, bwrap)
    drop = f"import os; os.setgroups([]); os.setgid({_FIRST_UID}); os.setuid({_FIRST_UID})"
    code = drop if probe.as_root else "pass"
    try:
        done = subprocess.run(
            probe.command([sys.executable, "-I", "-c", code], {"LANG": "C.UTF-8"}),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _reachable_by_others() -> bool:
    """True when another uid can run this interpreter: every folder above it is searchable by others
    (a Python under root's private home, for example, is not)."""
    for root in _read_only_roots():
        for folder in [Path(root), *Path(root).parents]:
            if not folder.stat().st_mode & stat.S_IXOTH:
                return False
    return True


def choose(unsafe: bool = False) -> Isolation:
    """The strongest isolation available here; IsolationUnavailable when none is and not ``unsafe``.

    ``SERVELAB_GRADE_ISOLATION`` (``bubblewrap`` / ``uid``) forces a level (an error if
    unavailable).
    """
    forced = os.environ.get("SERVELAB_GRADE_ISOLATION", "").strip()
    if forced not in ("", "bubblewrap", "uid"):
        raise ValueError(f"SERVELAB_GRADE_ISOLATION must be 'bubblewrap' or 'uid', got {forced!r}")
    bwrap = shutil.which("bwrap")
    if forced != "uid" and bwrap and sys.platform.startswith("linux") and _bwrap_works(bwrap):
        return Isolation(BUBBLEWRAP, bwrap)
    if (
        forced != "bubblewrap"
        and hasattr(os, "geteuid")
        and os.geteuid() == 0
        and _reachable_by_others()
    ):
        return Isolation(SEPARATE_UID)
    if forced:
        raise IsolationUnavailable(f"SERVELAB_GRADE_ISOLATION={forced} is not available here")
    if unsafe:
        return Isolation(NONE)
    raise IsolationUnavailable(
        "no isolation for student code: install bubblewrap (apt-get install bubblewrap) where user "
        "namespaces are allowed, or grade as root with a Python other users can run (each "
        "worker then "
        "gets a uid of its own). Without "
        f"either, {RISK}. To grade anyway, on submissions you trust, pass --unsafe."
    )
