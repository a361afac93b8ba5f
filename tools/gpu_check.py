"""The prepared GPU check: one run on one CUDA GPU (at most 8 minutes) writes one JSON of measured figures.

``python tools/gpu_check.py [--out PATH] [--dry-run]`` (``tools/gpu_check.sh`` calls it):

1. the engine's tests on CUDA (``pytest tests/test_engine*.py`` with ``SERVELAB_TEST_DEVICES=cuda``);
2. the benchmark on CUDA (:mod:`servelab.bench.engine_bench`, the shipped model in the device's dtype): engine vs
   the no-KV-cache loop vs ``transformers`` ``generate`` at batch 1, on the skewed 32-request workload and
   on 64 requests; continuous vs static batching;
3. the cost of one decode step (``LLMEngine.step``) at several batch sizes, for the shipped model and for
   a random-weight model of SmolLM2-135M's shape, set against two floors:

   * **bandwidth floor**: the bytes a decode step must read (every weight once, plus the K and V of every
     cached token of every sequence) divided by the device's measured copy bandwidth (a device-to-device
     copy of a large tensor, timed with CUDA events; read + write bytes over time);
   * **launch floor**: the kernels one step launches (counted with ``torch.profiler``) times the time of
     one tiny kernel launched back to back.

   Whichever floor is higher bounds the step from below; the measured step over it is how far the engine
   is from the hardware.

``--dry-run`` runs the same code on the CPU with tiny sizes in seconds (a CPU "kernel" is one ATen op,
its copy bandwidth a host memcpy), writes to a temporary path unless ``--out`` is given, and validates
the result against :data:`servelab.bench.gpu_results.SCHEMA`: so CI notices when the script rots. No figure
here is typed in; the book shows the GPU table only when the JSON exists
(:func:`servelab.bench.gpu_results.gpu_table`, the reading half, which ships with the library).

System boundary: this process, one device. Wall-clock seconds around calls that end in a host sync (the
engine reads its sampled tokens back), CUDA-event seconds for the copy and launch probes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from servelab.device import pick_device
from servelab.bench import engine_bench
from servelab.bench.gpu_results import DEFAULT_OUT, KIND, SCHEMA, gpu_rows, validate
from servelab.kv import kv_bytes_per_token
from servelab.model import LlamaForCausalLM, llama_config_from_hf, load_checkpoint, load_tokenizer
from servelab.model.pretrained import SMOLLM2_135M_CONFIG

@dataclass(frozen=True)
class Sizes:
    """How big each part of the check is: the GPU run's or the dry run's."""

    test_files: str  # glob of the test modules to run
    batch1_tokens: int
    short: tuple[int, int]  # output-length ranges of the skewed workload (tokens)
    long: tuple[int, int]
    repeats: int
    step_batches: tuple[int, ...]
    step_context: int  # tokens of history per sequence in the decode-step measurement
    timed_steps: int
    copy_bytes: int  # size of the bandwidth probe's tensor
    launches: int  # tiny kernels timed back to back
    smollm2_layers: int  # layers of the SmolLM2-shaped model (30 on the GPU)
    smollm2_vocab: int


GPU_SIZES = Sizes("tests/test_engine*.py", 128, (8, 32), (128, 192), 3, (1, 8, 32, 64), 256, 32,
                  1 << 30, 2000, SMOLLM2_135M_CONFIG["num_hidden_layers"], SMOLLM2_135M_CONFIG["vocab_size"])
DRY_SIZES = Sizes("tests/test_engine_bf16.py", 8, (2, 4), (8, 12), 1, (1, 4), 16, 2, 1 << 22, 50, 2, 2048)

# ------------------------------------------------------------------------------------------- probes


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds ``fn`` takes on ``device``: CUDA events around it on a GPU, ``perf_counter`` on the CPU."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    begin.record()
    fn()
    end.record()
    torch.cuda.synchronize(device)
    return begin.elapsed_time(end) / 1e3


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 5) -> float:
    """Bytes per second of a device-to-device copy of an ``nbytes`` tensor (read + write bytes), best of
    ``repeats`` after one warm-up."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(timed(lambda: dst.copy_(src), device) for _ in range(repeats))
    return 2 * src.numel() * src.element_size() / best


def launch_time(device: torch.device, launches: int) -> float:
    """Seconds per tiny kernel (an in-place add on one element), launched ``launches`` times back to back."""
    x = torch.zeros(1, device=device)

    def burst() -> None:
        for _ in range(launches):
            x.add_(1.0)

    burst()
    return min(timed(burst, device) for _ in range(3)) / launches


def count_kernels(fn: Callable[[], object], device: torch.device) -> int | None:
    """Kernels ``fn`` launches on a GPU (profiler kernel events), or ATen leaf ops it runs on a CPU; None
    when the profiler reports nothing usable."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.events()
    if device.type == "cuda":
        count = sum(1 for e in events if e.device_type == DeviceType.CUDA)
        count = count or sum(len(e.kernels) for e in events)
    else:
        count = sum(1 for e in events if e.name.startswith("aten::") and not e.cpu_children)
    return count or None


# ------------------------------------------------------------------------------------------- decode step


def weight_bytes(model: LlamaForCausalLM) -> int:
    """Bytes of the model's weights, a tied matrix counted once: what every decode step must read."""
    unique = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(unique.values())


def model_kv_bytes_per_token(model: LlamaForCausalLM) -> int:
    """Bytes of K and V one cached token holds over all layers, in the model's dtype."""
    cfg = model.config
    return kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                              model.lm_head.weight.element_size())


def step_row(model, tokenizer, batch: int, sizes: Sizes, probes: dict, rng: random.Random) -> dict:
    """One decode-step measurement at ``batch`` sequences, with its two floors (seconds)."""
    device = model.lm_head.weight.device
    engine = engine_bench.decoding_engine(model, tokenizer, batch, sizes.step_context, sizes.timed_steps + 1, rng)
    kernels = count_kernels(engine.step, device)  # one pure decode step, profiled (not timed)
    steps = sizes.timed_steps
    step_s = timed(lambda: [engine.step() for _ in range(steps)], device) / steps
    moved = weight_bytes(model) + batch * (sizes.step_context + 1) * model_kv_bytes_per_token(model)
    return {"batch": batch, "context_tokens": sizes.step_context, "step_s": step_s, "bytes_moved": moved,
            "bandwidth_floor_s": moved / probes["copy_bandwidth_bytes_per_s"], "kernels": kernels,
            "launch_floor_s": None if kernels is None else kernels * probes["launch_s"]}


def smollm2_shaped(sizes: Sizes, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    """A random-weight model of SmolLM2-135M's shape (``sizes`` may cut its layers and vocabulary)."""
    cfg = llama_config_from_hf(SMOLLM2_135M_CONFIG | {"num_hidden_layers": sizes.smollm2_layers,
                                                      "vocab_size": sizes.smollm2_vocab})
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def measure_decode(models: dict[str, LlamaForCausalLM], tokenizer, sizes: Sizes, device: torch.device) -> dict:
    """The probes, then every model's decode-step rows."""
    probes = {"copy_bandwidth_bytes_per_s": copy_bandwidth(device, sizes.copy_bytes),
              "launch_s": launch_time(device, sizes.launches),
              "kernel_count": "profiler kernel events" if device.type == "cuda" else "ATen leaf ops (CPU)"}
    rng = random.Random(0)
    result = dict(probes, models={})
    for name, model in models.items():
        rows = [step_row(model, tokenizer, batch, sizes, probes, rng) for batch in sizes.step_batches]
        result["models"][name] = {"parameters": sum(p.numel() for p in model.parameters()),
                                  "weight_bytes": weight_bytes(model), "rows": rows}
    return result


# ------------------------------------------------------------------------------------------- the run


def run_engine_tests(sizes: Sizes, device: torch.device) -> dict:
    """The engine's test modules on ``device`` only, in a child pytest; its exit status and summary line."""
    files = sorted(glob.glob(sizes.test_files))  # relative to the repository root, where the script runs
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    record = {"command": " ".join(command[1:]), "device": device.type}
    if not files:
        return record | {"returncode": 5, "summary": f"no test files match {sizes.test_files} here ({os.getcwd()})"}
    env = dict(os.environ, SERVELAB_TEST_DEVICES=device.type)
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return record | {"returncode": 124, "summary": "the engine tests ran past 300 s"}
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return record | {"returncode": done.returncode, "summary": lines[-1] if lines else done.stderr[-500:]}


def run_benchmark(model, tokenizer, sizes: Sizes) -> dict:
    """The benchmark sections the check repeats on the device (see :mod:`servelab.bench.engine_bench`)."""
    rng = random.Random(0)
    hf = engine_bench.to_transformers(model)
    sections = {"batch1": engine_bench.bench_batch1(model, tokenizer, hf, rng, sizes.batch1_tokens, sizes.repeats)}
    for count in (32, 64):
        sections[f"skewed_{count}"] = engine_bench.bench_skewed(model, tokenizer, hf, rng, count, sizes.short,
                                                                sizes.long, sizes.repeats)
    sections["continuous_vs_static"] = engine_bench.bench_continuous_vs_static(model, tokenizer, rng, 32, 8,
                                                                               sizes.short, sizes.long, sizes.repeats)
    return sections


def run(dry_run: bool = False) -> dict:
    """The whole check: on CUDA in its default dtype, or (``dry_run``) on the CPU in float32, tiny sizes."""
    sizes = DRY_SIZES if dry_run else GPU_SIZES
    device, dtype = pick_device("cpu" if dry_run else "cuda", "float32" if dry_run else None)
    start = time.perf_counter()
    timings = {}
    result = {"kind": KIND, "dry_run": dry_run, "hardware": engine_bench.hardware(device, dtype)}
    result["engine_tests"] = run_engine_tests(sizes, device)
    timings["engine_tests"] = time.perf_counter() - start
    model = load_checkpoint(device=device, dtype=dtype)
    tokenizer = load_tokenizer()
    result["benchmark"] = run_benchmark(model, tokenizer, sizes)
    timings["benchmark"] = time.perf_counter() - start - timings["engine_tests"]
    models = {"shipped": model, "smollm2_135m_shape": smollm2_shaped(sizes, device, dtype)}
    result["decode_step"] = measure_decode(models, tokenizer, sizes, device)
    result["seconds_total"] = time.perf_counter() - start
    result["seconds_by_part"] = timings
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: run, validate, save; print where the JSON went."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the same code on the CPU, tiny sizes, seconds")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where to write the JSON (default: {DEFAULT_OUT}; a temporary file for --dry-run)")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA GPU here; use --dry-run to check the script on the CPU")
    result = run(args.dry_run)
    validate(result)
    out = args.out or (Path(tempfile.mkdtemp()) / "gpu_check_dry_run.json" if args.dry_run else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"engine tests on {result['engine_tests']['device']}: {result['engine_tests']['summary']}")
    for row in gpu_rows(result):
        print(f"{row['measurement']:<90} {row['figure']}")
    print(f"saved {out} ({result['seconds_total']:.0f} s)")
    return 0 if result["engine_tests"]["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
