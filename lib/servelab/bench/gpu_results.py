"""The prepared GPU check's result, read back: its schema, its validation and the §5 table from it.

The check itself (``bash tools/gpu_check.sh``, the code in ``tools/gpu_check.py``) runs once on a
CUDA GPU and writes one JSON, by default ``lib/servelab/data/engine_bench_gpu.json``; this module is
the half a notebook needs: :func:`gpu_table` is the table of a committed result, or None while there
is none.

System boundary: a file on disk; no device is touched here.
"""

from __future__ import annotations

import json
from pathlib import Path

from servelab.bench.engine_bench import DATA_DIR

__all__ = ["DEFAULT_OUT", "KIND", "SCHEMA", "gpu_rows", "gpu_table", "hardware_line", "validate"]

DEFAULT_OUT = DATA_DIR / "engine_bench_gpu.json"
KIND = "servelab-gpu-check"

_RATES = {"type": "object", "additionalProperties": {"type": "number", "exclusiveMinimum": 0}}
_SECTION = {
    "type": "object",
    "required": ["tokens_per_s", "seconds"],
    "properties": {"tokens_per_s": _RATES},
}
_STEP_ROW = {"type": "object", "required": ["batch", "context_tokens", "step_s", "bytes_moved",
                                            "bandwidth_floor_s", "kernels", "launch_floor_s"],
             "properties": {"batch": {"type": "integer", "minimum": 1},
                            "step_s": {"type": "number", "exclusiveMinimum": 0},
                            "bytes_moved": {"type": "integer", "minimum": 1},
                            "bandwidth_floor_s": {"type": "number", "exclusiveMinimum": 0},
                            "kernels": {"type": ["integer", "null"], "minimum": 1},
                            "launch_floor_s": {"type": ["number", "null"], "exclusiveMinimum": 0}}}
SCHEMA = {
    "type": "object",
    "required": [
        "kind",
        "dry_run",
        "hardware",
        "engine_tests",
        "benchmark",
        "decode_step",
        "seconds_total",
    ],
    "properties": {
        "kind": {"const": KIND},
        "dry_run": {"type": "boolean"},
        "hardware": {
            "type": "object",
            "required": ["device", "gpu", "cuda", "torch", "cpu", "dtype"],
        },
        "engine_tests": {
            "type": "object",
            "required": ["command", "returncode", "summary"],
            "properties": {"returncode": {"type": "integer"}, "summary": {"type": "string"}},
        },
        "benchmark": {
            "type": "object",
            "required": ["batch1", "skewed_32", "skewed_64", "continuous_vs_static"],
            "additionalProperties": _SECTION,
        },
        "decode_step": {
            "type": "object",
            "required": ["copy_bandwidth_bytes_per_s", "launch_s", "kernel_count", "models"],
            "properties": {
                "copy_bandwidth_bytes_per_s": {"type": "number", "exclusiveMinimum": 0},
                "launch_s": {"type": "number", "exclusiveMinimum": 0},
                "models": {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": {
                        "type": "object",
                        "required": ["parameters", "weight_bytes", "rows"],
                        "properties": {
                            "rows": {"type": "array", "minItems": 1, "items": _STEP_ROW}
                        },
                    },
                },
            },
        },
        "seconds_total": {"type": "number", "minimum": 0},
    },
}
"""What the JSON must hold (JSON Schema); :func:`validate` also demands a CUDA device unless it is a
dry run."""



def validate(result: dict) -> None:
    """Raise ValueError when ``result`` does not fit :data:`SCHEMA`, or claims GPU figures without a
    GPU."""
    import jsonschema

    try:
        jsonschema.validate(result, SCHEMA)
    except jsonschema.ValidationError as exc:
        raise ValueError(f"GPU check result does not fit the schema at {list(exc.absolute_path)}: "
                         f"{exc.message}") from None
    if not result["dry_run"] and not (
        result["hardware"]["device"].startswith("cuda") and result["hardware"]["gpu"]
    ):
        raise ValueError(
            "a GPU check result (dry_run false) must come from a CUDA device with a GPU name"
        )


def gpu_rows(result: dict) -> list[dict[str, str]]:
    """(measurement, figure) rows of a check result, for the §5 table."""
    b = result["benchmark"]
    tps = "{:,.0f} tok/s".format
    rows = [
        (
            "batch 1: engine / no KV cache / generate",
            " / ".join(
                tps(b["batch1"]["tokens_per_s"][k])
                for k in ("engine", "no_kv_cache", "transformers_generate")
            ),
        )
    ]
    for count in (32, 64):
        rates = b[f"skewed_{count}"]["tokens_per_s"]
        rows.append(
            (
                f"{count} skewed requests: engine / generate (padded) / no KV cache",
                " / ".join(
                    tps(rates[k]) for k in ("engine", "transformers_generate_static", "no_kv_cache")
                ),
            )
        )
    rates = b["continuous_vs_static"]["tokens_per_s"]
    rows.append(
        (
            "8 slots: continuous / static batching",
            f"{tps(rates['continuous'])} / {tps(rates['static'])}",
        )
    )
    step = result["decode_step"]
    rows.append(
        (
            "device copy bandwidth; one tiny kernel",
            f"{step['copy_bandwidth_bytes_per_s'] / 1e9:,.0f} GB/s; "
            f"{step['launch_s'] * 1e6:.1f} us",
        )
    )
    for name, model in step["models"].items():
        for r in model["rows"]:
            launch = "n/a" if r["launch_floor_s"] is None else f"{r['launch_floor_s'] * 1e3:.2f}"
            rows.append(
                (
                    f"{name} ({model['parameters'] / 1e6:.0f} M), decode step at batch "
                    f"{r['batch']}: "
                    "measured / bandwidth floor / launch floor",
                    f"{r['step_s'] * 1e3:.2f} / {r['bandwidth_floor_s'] * 1e3:.3f} / {launch} ms",
                )
            )
    return [{"measurement": m, "figure": f} for m, f in rows]


def hardware_line(result: dict) -> str:
    """The GPU, CUDA and torch versions and dtype a check result was measured with."""
    hw = result["hardware"]
    return f"{hw['gpu'] or hw['cpu']}, CUDA {hw['cuda']}, torch {hw['torch']}, {hw['dtype']}"


def gpu_table(path: str | Path = DEFAULT_OUT):
    """The §5 table of a committed GPU check (a :class:`servelab.viz.core.Table`), or None when no
    GPU check has been run and committed at ``path``. A dry-run result is refused (ValueError)."""
    path = Path(path)
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    validate(result)
    if result["dry_run"]:
        raise ValueError(f"{path} holds a dry run (CPU, tiny sizes), not GPU figures")
    from servelab.viz.core import table

    return table(gpu_rows(result), caption="GPU check: " + hardware_line(result))
