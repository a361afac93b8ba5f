"""The one device rule of the course: where tensors live and in which float type.

:func:`pick_device` answers for the engine, the benchmark, the server, the checkpoint loader and
every
notebook: CUDA in bfloat16 when a GPU is present (float16 on a GPU without native bf16, such as
Colab's T4), else the CPU in float32 (bf16 matmuls are slower than fp32 at batch 1 on a CPU). An
explicit argument wins, then the environment variables ``SERVELAB_DEVICE`` (``cpu``, ``cuda`` or
``cuda:N``) and ``SERVELAB_DTYPE`` (``float32``, ``bfloat16``, ``float16``), then that default.

System boundary: names in, a ``(torch.device, torch.dtype)`` pair out. Nothing is allocated here;
asking for CUDA where torch sees no GPU is an error, never a silent fall-back to the CPU.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from servelab._validate import require_name
from servelab.prose import count

if TYPE_CHECKING:
    from servelab.engine.config import EngineConfig

__all__ = ["DEVICE_ENV", "DTYPE_ENV", "DTYPES", "describe_device", "dtype_name", "pick_device"]

DEVICE_ENV = "SERVELAB_DEVICE"
DTYPE_ENV = "SERVELAB_DTYPE"
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_DEVICE_TYPES = ("cpu", "cuda")


def pick_device(device: str | torch.device | None = None,
                dtype: str | torch.dtype | None = None) -> tuple[torch.device, torch.dtype]:
    """The device and dtype to run on: the arguments, else ``SERVELAB_DEVICE`` / ``SERVELAB_DTYPE``,
    else CUDA + bfloat16 when a GPU is present and CPU + float32 otherwise.

    Raises:
        ValueError: an unknown device or dtype name (naming the argument or environment variable and
            the allowed values), or CUDA asked for where ``torch.cuda.is_available()`` is False.
    """
    where = (_device(device, "device") if device is not None
             else _device(os.environ.get(DEVICE_ENV) or None, DEVICE_ENV))
    if dtype is not None:
        return where, _dtype(dtype, "dtype")
    if os.environ.get(DTYPE_ENV):
        return where, _dtype(os.environ[DTYPE_ENV], DTYPE_ENV)
    if where.type == "cuda":
        return where, torch.bfloat16 if native_bf16(where) else torch.float16
    return where, torch.float32


def native_bf16(device: torch.device) -> bool:
    """Whether the GPU computes bfloat16 natively (compute capability 8.0+). A T4 (7.5) answers True
    to a plain ``torch.cuda.is_bf16_supported()`` because bf16 can be emulated there, slowly: it
    gets float16."""
    with torch.cuda.device(device):
        return torch.cuda.is_bf16_supported(including_emulation=False)


def _device(value: str | torch.device | None, name: str) -> torch.device:
    """``value`` as a torch.device (None: CUDA when available, else CPU); ``name`` is where it came
    from."""
    if value is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(value, torch.device):
        require_name(name, value)
        try:
            value = torch.device(value)
        except RuntimeError:
            raise ValueError(
                f"{name} must be one of 'cpu', 'cuda', 'cuda:N', got {value!r}"
            ) from None
    if value.type not in _DEVICE_TYPES:
        raise ValueError(f"{name} must be one of 'cpu', 'cuda', 'cuda:N', got {str(value)!r}")
    if value.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name} is {str(value)!r} but torch sees no CUDA GPU here "
                         f"(torch {torch.__version__}); use 'cpu' or run on a GPU machine")
    if (
        value.type == "cuda"
        and value.index is not None
        and value.index >= torch.cuda.device_count()
    ):
        raise ValueError(f"{name} is {str(value)!r} but torch sees only "
                         f"{count(torch.cuda.device_count(), 'CUDA device')}")
    return value


def _dtype(value: str | torch.dtype, name: str) -> torch.dtype:
    """``value`` (a name in :data:`DTYPES` or one of its torch dtypes) as a torch.dtype."""
    if isinstance(value, torch.dtype):
        if value not in DTYPES.values():
            raise ValueError(f"{name} must be one of {tuple(DTYPES)}, got {value}")
        return value
    require_name(name, value)
    if value not in DTYPES:
        raise ValueError(f"{name} must be one of {tuple(DTYPES)}, got {value!r}")
    return DTYPES[value]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def describe_device(device: torch.device) -> dict[str, str | int | None]:
    """What a device is, for a benchmark record: its type, the GPU's name and CUDA version (None on
    a CPU), the CPU model and torch's version."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"device": str(device), "gpu": gpu, "cuda": torch.version.cuda if gpu else None,
            "cpu": _cpu_model(), "torch": torch.__version__}


def _cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux), else what :mod:`platform` knows."""
    import platform

    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def resolve_device_dtype(
    config: "EngineConfig", model: torch.nn.Module | None = None
) -> tuple[torch.device, torch.dtype]:
    """The configured device and dtype. A field left ``None`` follows ``model``'s weights when a
    model is given (its caller already put it somewhere: the engine never moves or casts it behind
    their back), else the course's one rule (:func:`servelab.device.pick_device`)."""
    weight = None if model is None else model.lm_head.weight
    device = config.device if config.device is not None or weight is None else weight.device
    dtype = config.dtype if config.dtype is not None or weight is None else weight.dtype
    return pick_device(device, dtype)
