"""``python -m servelab.bench``: the command line of the engine benchmark and the decode-floor run.

It sits above both (:mod:`servelab.bench.engine_bench`, :mod:`servelab.bench.decode_floor`, which
builds on the benchmark), so neither imports the other back.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from servelab.bench import engine_bench
from servelab.bench import real_model, spec_bench
from servelab.bench.engine_bench import DATA_DIR, SMOLLM2_135M
from servelab.device import DTYPES, pick_device

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Command line: run, print the table, save the JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m servelab.bench", description=engine_bench.__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer tokens and one repeat (seconds, not minutes)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write the JSON result (default: data/engine_bench_{cpu,cuda}.json)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help=f"checkpoint folder (default: the shipped model), or {SMOLLM2_135M!r}: the real "
        "SmolLM2-135M against transformers, its decode step against this machine's floor",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help=f"torch threads (default: 1; 2 for {SMOLLM2_135M!r} and --speculative)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="where to run (default: SERVELAB_DEVICE, else cuda when present, else cpu)",
    )
    parser.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default=None,
        help="weights and KV dtype (default: SERVELAB_DTYPE, else bfloat16 on cuda, float32 on "
        "cpu)",
    )
    parser.add_argument(
        "--speculative",
        action="store_true",
        help="n-gram and draft-model speculation on the real SmolLM2-135M (CPU, 2 threads)",
    )
    args = parser.parse_args(argv)
    if args.speculative:
        result = spec_bench.run(args.threads or 2, args.quick)
        print(spec_bench.format_result(result))
        out = args.out or DATA_DIR / "engine_bench_cpu_speculative.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nsaved {out}")
        return
    if args.model == SMOLLM2_135M:
        result = real_model.run(args.threads or 2, args.quick)
        print(real_model.format_result(result))
        out = args.out or DATA_DIR / "engine_bench_cpu_smollm2.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nsaved {out}")
        return
    if args.threads is not None:
        parser.error(f"--threads applies only to --model {SMOLLM2_135M} and --speculative")
    try:
        where, _ = pick_device(args.device, args.dtype)
    except ValueError as exc:  # e.g. --device cuda on a machine without a GPU
        parser.error(str(exc))
    result = engine_bench.run(args.quick, args.model, args.device, args.dtype)
    print(engine_bench.format_table(result))
    out = args.out or engine_bench.default_out(where)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nsaved {out}")
