"""This machine, measured once: the profile every page that states a property of "this machine"
reads.

A :class:`MachineProfile` holds what the CPU is (model name, the SIMD flags that decide which
kernels run, torch's kernel family, the thread count the notebooks time on) and what it does (read
bandwidth, peak matmul FLOP/s in fp32 and bf16, the cost of one empty operator), plus the load
average at the moment it was measured. :func:`machine_profile` returns one profile per build:

* the book build measures it once, before any notebook runs, into the JSON file named by the
  environment variable ``SERVELAB_MACHINE_PROFILE`` (``python -m servelab.bench.machine PATH``);
  every notebook kernel then reads that file, so every page quotes the same figures;
* a notebook run alone (Jupyter, Colab) has no such file: the profile is measured once in that
  process and :attr:`MachineProfile.source` says so.

System boundary: this process on the CPU, ``threads`` torch threads (the notebooks' one), timed in
CPU seconds of the calling thread (:func:`time.thread_time`, so other processes on a shared machine
do not inflate it). Units: bytes/s, FLOP/s, seconds.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from servelab._validate import require_int, require_real
from servelab.device import _cpu_model
from servelab.metrics.roofline.measured import (Roofline, measure_matmul_flops, measure_op_overhead,
                                        measure_read_bandwidth)

PROFILE_ENV = "SERVELAB_MACHINE_PROFILE"
SIMD_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
"""The CPU flags that decide which matmul kernels can run (``/proc/cpuinfo`` names)."""
BF16_NATIVE_FLAGS = ("amx_bf16", "avx512_bf16")
"""Either one gives the CPU bf16 dot-product instructions: a bf16 matmul needs no conversion to
fp32."""
MEASURED_HERE = "measured once in this process (no build profile was found)"
FROM_BUILD = "measured once for this build, before any notebook ran"

__all__ = ["MachineProfile", "PROFILE_ENV", "cpu_flags", "machine_profile", "measure_profile",
           "read_profile", "write_profile"]


def cpu_flags() -> tuple[str, ...]:
    """The :data:`SIMD_FLAGS` this CPU has (empty where ``/proc/cpuinfo`` is not readable)."""
    try:
        with open("/proc/cpuinfo") as info:
            line = next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return ()
    present = set(line.split(":", 1)[-1].split())
    return tuple(flag for flag in SIMD_FLAGS if flag in present)


@dataclass(frozen=True)
class MachineProfile:
    """One machine's measured properties (see the module docstring for units and boundary)."""

    cpu: str
    flags: tuple[str, ...]
    kernel_family: str
    threads: int
    cores: int
    read_bandwidth: float
    peak_flops: dict[str, float]
    op_overhead_s: float
    load_average: tuple[float, float, float]
    torch_version: str
    measured_at: str
    source: str = field(default=MEASURED_HERE, compare=False)

    @property
    def bf16_native(self) -> bool:
        """Whether the CPU has bf16 dot-product instructions (AMX or AVX-512 BF16)."""
        return any(flag in self.flags for flag in BF16_NATIVE_FLAGS)

    @property
    def bf16_over_fp32(self) -> float:
        """The measured bf16 matmul peak over the fp32 one."""
        return self.peak_flops["bfloat16"] / self.peak_flops["float32"]

    def roofline(self) -> Roofline:
        """The profile as a :class:`~servelab.metrics.roofline.measured.Roofline` (the floors of a
        step)."""
        return Roofline(
            self.read_bandwidth, dict(self.peak_flops), self.op_overhead_s, self.threads
        )

    def hardware(self) -> str:
        """One line naming the machine, e.g. "AMD EPYC, 2 cores, avx512 kernels, 1 torch thread"."""
        threads = f"{self.threads} torch thread" + ("" if self.threads == 1 else "s")
        return f"{self.cpu}, {self.cores} cores, {self.kernel_family} kernels, {threads}"

    def bf16_sentence(self) -> str:
        """What the bf16 figure means on this CPU, from its flags and the measured ratio."""
        native = [flag for flag in BF16_NATIVE_FLAGS if flag in self.flags]
        ratio = f"{self.bf16_over_fp32:.2f}× the fp32 rate"
        if native:
            return f"bf16 matmuls run natively here ({', '.join(native)}): {ratio}"
        return f"this CPU has no bf16 instructions (no AMX, no AVX-512 BF16): {ratio}"

    def rows(self) -> list[dict[str, str]]:
        """The profile as a two-column table (quantity, value), for the one page that shows it."""
        load = ", ".join(f"{x:.2f}" for x in self.load_average)
        return [
            {"quantity": "CPU", "value": self.cpu},
            {"quantity": "cores / torch threads", "value": f"{self.cores} / {self.threads}"},
            {
                "quantity": "SIMD flags",
                "value": ", ".join(self.flags) or "none of " + ", ".join(SIMD_FLAGS),
            },
            {"quantity": "torch kernel family", "value": self.kernel_family},
            {"quantity": "read bandwidth", "value": f"{self.read_bandwidth / 1e9:.1f} GB/s"},
            {
                "quantity": "fp32 matmul peak",
                "value": f"{self.peak_flops['float32'] / 1e9:.1f} GFLOP/s",
            },
            {
                "quantity": "bf16 matmul peak",
                "value": f"{self.peak_flops['bfloat16'] / 1e9:.1f} GFLOP/s",
            },
            {"quantity": "bf16 native", "value": "yes" if self.bf16_native else "no"},
            {"quantity": "one empty operator", "value": f"{self.op_overhead_s * 1e6:.2f} µs"},
            {
                "quantity": "ridge point (fp32)",
                "value": f"{self.roofline().ridge_point('float32'):.1f} FLOP/byte",
            },
            {"quantity": "load average (1, 5, 15 min)", "value": load},
            {"quantity": "torch", "value": self.torch_version},
            {"quantity": "measured at (UTC)", "value": self.measured_at},
        ]

    def to_dict(self) -> dict:
        """JSON-ready (``source`` is not stored: it says how this process got the profile)."""
        data = asdict(self)
        data.pop("source")
        data["bf16_native"] = self.bf16_native
        data["ridge_point_flop_per_byte"] = self.roofline().ridge_point("float32")
        return data

    @classmethod
    def from_dict(cls, data: dict, source: str) -> MachineProfile:
        """The inverse of :meth:`to_dict`."""
        names = {f.name for f in cls.__dataclass_fields__.values()} - {"source"}
        missing = names - set(data)
        if missing:
            raise ValueError(
                f"a machine profile must hold {sorted(names)}, missing {sorted(missing)}"
            )
        values = {name: data[name] for name in names}
        values["flags"] = tuple(values["flags"])
        values["load_average"] = tuple(values["load_average"])
        return cls(**values, source=source)


def measure_profile(threads: int = 1, budget_s: float = 0.2, bandwidth_bytes: int = 128 << 20,
                    matmul_size: int = 256) -> MachineProfile:
    """Measure this machine at ``threads`` torch threads (restored afterwards), each probe for about
    ``budget_s`` CPU-clock seconds (about two seconds in all)."""
    count = require_int("threads", threads, minimum=1)
    budget = require_real("budget_s", budget_s, 0.0, strict_min=True)
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
        clock = time.thread_time if count == 1 else time.perf_counter
        bandwidth = measure_read_bandwidth(bandwidth_bytes, budget, clock)
        peaks = {name: measure_matmul_flops(dtype, matmul_size, budget, clock)
                 for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))}
        overhead = measure_op_overhead(budget * 2 / 3, clock=clock)
    finally:
        torch.set_num_threads(before)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    return MachineProfile(cpu=_cpu_model(), flags=cpu_flags(),
                          kernel_family=torch.backends.cpu.get_cpu_capability(), threads=count,
                          cores=os.cpu_count() or 1, read_bandwidth=bandwidth, peak_flops=peaks,
                          op_overhead_s=overhead, load_average=tuple(round(x, 2) for x in load),
                          torch_version=torch.__version__, measured_at=now)


def write_profile(profile: MachineProfile, path: Path) -> None:
    """Write ``profile`` to ``path`` as JSON, atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(profile.to_dict(), indent=1))
    os.replace(tmp, path)


def read_profile(path: Path) -> MachineProfile:
    """The profile stored at ``path`` (:data:`FROM_BUILD` as its source)."""
    return MachineProfile.from_dict(json.loads(Path(path).read_text()), FROM_BUILD)


_PROCESS_PROFILE: list[MachineProfile] = []


def machine_profile() -> MachineProfile:
    """This build's profile: read from ``$SERVELAB_MACHINE_PROFILE`` when that file exists and was
    measured under this process's torch kernel family, measured into it when it is named but
    missing; otherwise measured once per process (later calls return the same profile)."""
    if _PROCESS_PROFILE:
        return _PROCESS_PROFILE[0]
    named = os.environ.get(PROFILE_ENV)
    family = torch.backends.cpu.get_cpu_capability()
    profile = None
    if named and Path(named).is_file():
        stored = read_profile(Path(named))
        profile = stored if stored.kernel_family == family else None
    if profile is None:
        profile = measure_profile()
        if named and not Path(named).exists():
            write_profile(profile, Path(named))
            profile = replace(profile, source=FROM_BUILD)
    _PROCESS_PROFILE.append(profile)
    return profile


def main(argv: list[str]) -> int:
    """``python -m servelab.bench.machine PATH``: measure this machine and write its profile to
    PATH."""
    if len(argv) != 1:
        print("usage: python -m servelab.bench.machine PATH", file=sys.stderr)
        return 2
    profile = measure_profile()
    write_profile(profile, Path(argv[0]))
    print(f"machine profile: {profile.hardware()}, {profile.read_bandwidth / 1e9:.1f} GB/s, "
          f"{profile.peak_flops['float32'] / 1e9:.1f} fp32 GFLOP/s -> {argv[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
