"""Soak benchmark: does the server's resident memory stay flat over many requests?

``python -m servelab.server.soak [--requests N] [--concurrency C] [--max-tokens T] [--out PATH]``

Drives ``N`` short requests (default 100,000) through the course server's request path -- the
:class:`~servelab.server.bridge.EngineBridge` with :class:`~servelab.server.app.ServerConfig`'s
default flags and its :class:`~servelab.server.metrics.ServerMetrics`, over the shipped model as
``python -m servelab.server`` builds it (tracing off) -- from ``C`` concurrent asyncio clients, each
submitting a prompt of a few tokens with ``max_tokens=T`` (greedy, EOS ignored) and reading its
stream to the end, as an HTTP handler does. HTTP parsing and the ingress gate are left out: they
hold nothing per request, and the gate's rate limit would only slow the run.

It reads resident memory (``VmRSS`` from ``/proc/self/status``, bytes) at 50 evenly spaced points,
prints every tenth, and fits a least-squares line to the points of the second half (after the
warm-up and after the bounded stores -- the ledger's window, the ring buffers -- have filled): the
slope in bytes per request is the leak rate. **Flat** means a slope below
:data:`FLAT_BYTES_PER_REQUEST`. What it catches, as measured on a shared 2-core AMD EPYC (torch 2.13
CPU, 20,000 requests, a 1,000-record ledger window: ``data/soak_cpu_side_by_side.json``): a ledger
that remembered every request id ever used, plus requests freed only by the cyclic garbage
collector, came to about 186 bytes per request; without either, 6. The JSON result (default
``data/soak_cpu.json``) records the hardware, the load and every point.

System boundary: one process; memory is the whole process's (Python objects, torch's allocations,
allocator slack); times are ``time.perf_counter`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from servelab._validate import require_int
from servelab.engine import EngineConfig, LLMEngine
from servelab.bench.engine_bench import DATA_DIR, hardware
from servelab.sampling import SamplingParams
from servelab.server.config import ServerConfig
from servelab.server.bridge import EngineBridge
from servelab.server.metrics import ServerMetrics

__all__ = [
    "FLAT_BYTES_PER_REQUEST",
    "DEFAULT_OUT",
    "rss_bytes",
    "slope_bytes_per_request",
    "soak",
    "main",
]

FLAT_BYTES_PER_REQUEST = 20.0
"""The flat criterion: a second-half slope under this many bytes per request."""
POINTS = 50  # memory readings over a run (every tenth is printed)
DEFAULT_OUT = DATA_DIR / "soak_cpu.json"


def rss_bytes() -> int:
    """This process's resident memory now (bytes), ``VmRSS`` from ``/proc/self/status`` (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise RuntimeError("/proc/self/status has no VmRSS line")


def slope_bytes_per_request(points: list[tuple[int, int]]) -> float:
    """Least-squares slope (bytes per request) of ``(requests done, RSS bytes)`` points (at least
    two)."""
    if len(points) < 2:
        raise ValueError(f"points must hold at least 2 readings, got {len(points)}")
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:
        raise ValueError("points must have at least two different request counts")
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / var


async def _drive(bridge: EngineBridge, requests: int, concurrency: int, max_tokens: int, vocab: int,
                 deadline_s: float, report) -> dict[str, int]:
    """Run ``requests`` requests from ``concurrency`` clients; ``report(done)`` after each one ends.
    Returns the finish reasons seen, counted."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    rng = random.Random(0)
    counter = iter(range(requests))
    reasons: dict[str, int] = {}

    async def client() -> None:
        for _ in counter:
            prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(3, 8))]
            stream = bridge.submit(prompt, params, deadline_s=deadline_s)
            while not (output := await stream.next()).finished:
                pass
            reasons[output.finish_reason] = reasons.get(output.finish_reason, 0) + 1
            report(sum(reasons.values()))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return reasons


def soak(
    requests: int = 100_000,
    concurrency: int = 16,
    max_tokens: int = 3,
    engine: LLMEngine | None = None,
    echo: Callable[[str], None] = print,
) -> dict:
    """Run the soak (see the module docstring); returns the JSON-ready result. ``engine``: default
    the shipped model as the server's main builds it (tracing off); ``echo`` prints the
    checkpoints."""
    config = ServerConfig()
    require_int("requests", requests, POINTS)
    # more would be refused as Overloaded
    require_int("concurrency", concurrency, 1, config.max_waiting)
    require_int("max_tokens", max_tokens, 1)
    engine = LLMEngine.from_pretrained() if engine is None else engine
    every = requests // POINTS
    points: list[tuple[int, int]] = []
    start = time.perf_counter()

    def report(done: int) -> None:
        if done % every == 0 or done == requests:
            points.append((done, rss_bytes()))
            # every 10 %; points[0] is the reading before the run
            if (len(points) - 1) % (POINTS // 10) == 0:
                echo(f"{done:>9,} requests  RSS {points[-1][1] / 2**20:8.1f} MiB  "
                     f"{done / (time.perf_counter() - start):6.0f} requests/s")

    async def main() -> dict[str, int]:
        bridge = EngineBridge(
            engine,
            config.max_waiting,
            config.queue_timeout_s,
            config.stream_buffer_chunks,
            config.backpressure_timeout_s,
            ServerMetrics(config.model_name),
        )
        bridge.start(asyncio.get_running_loop())
        try:
            return await _drive(
                bridge,
                requests,
                concurrency,
                max_tokens,
                engine.runner.model.config.vocab_size,
                config.request_timeout_s,
                report,
            )
        finally:
            bridge.stop()

    points.append((0, rss_bytes()))
    reasons = asyncio.run(main())
    wall = time.perf_counter() - start
    second_half = [p for p in points if p[0] >= requests // 2]
    slope = slope_bytes_per_request(second_half)
    weight = engine.runner.model.lm_head.weight
    totals = engine.stats().ended
    return {
        "hardware": hardware(weight.device, weight.dtype),
        "load": {
            "requests": requests,
            "concurrency": concurrency,
            "prompt_tokens": [3, 8],
            "max_tokens": max_tokens,
            "sampling": "greedy, EOS ignored",
            "request_path": "EngineBridge + ServerMetrics, ServerConfig "
            "defaults, deadline_s = request_timeout_s",
            "trace_steps": engine.config.trace_steps,
            "ledger_size": engine.config.ledger_size,
        },
        "wall_s": wall,
        "requests_per_s": requests / wall,
        "finish_reasons": reasons,
        "ledger_totals": {"requests": totals.requests, "generated_tokens": totals.generated_tokens},
        "rss_bytes": [{"requests": x, "rss": y} for x, y in points],
        "slope_bytes_per_request_second_half": slope,
        "flat_criterion_bytes_per_request": FLAT_BYTES_PER_REQUEST,
        "flat": abs(slope) < FLAT_BYTES_PER_REQUEST,
    }


def main(argv: list[str] | None = None) -> None:
    """Command line: run the soak, print the checkpoints and the slope, save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests", type=int, default=100_000, help="requests to send (default 100000)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=16, help="clients with one request in flight each"
    )
    parser.add_argument("--max-tokens", type=int, default=3, help="tokens each request generates")
    parser.add_argument(
        "--ledger-size",
        type=int,
        default=EngineConfig.ledger_size,
        help=f"terminal records the engine keeps (default {EngineConfig.ledger_size})",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON result"
    )
    parser.add_argument(
        "--note", default="", help="a remark saved with the result (e.g. why N is not the default)"
    )
    args = parser.parse_args(argv)
    result = {
        "command": "python -m servelab.server.soak "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "note": args.note,
        **soak(
            args.requests,
            args.concurrency,
            args.max_tokens,
            LLMEngine.from_pretrained(ledger_size=args.ledger_size),
            echo=lambda line: print(line, flush=True),
        ),
    }
    hw = result["hardware"]
    print(
        f"second-half slope: {result['slope_bytes_per_request_second_half']:.1f} bytes/request "
        f"({'flat' if result['flat'] else 'NOT flat'}: criterion < {FLAT_BYTES_PER_REQUEST:g}); "
        f"{result['requests_per_s']:.0f} requests/s on {hw['cpu']}, {hw['cores']} cores, "
        f"torch {hw['torch']}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
