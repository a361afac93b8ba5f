"""``python -m servelab.server``: serve the shipped Shakespeare model (or a checkpoint folder) over
HTTP.

Examples::

    python -m servelab.server                                   # http://127.0.0.1:8000/v1, open access
    python -m servelab.server --port 8001 --api-key sk-a=alice --api-key sk-b=bob --rate 5 --burst 10
    python -m servelab.server --model-dir path/to/llama --max-num-seqs 16 --num-blocks 512
    python -m servelab.server --model-dir path/to/llama --gpu-memory-utilization 0.9   # KV pool sized from GPU memory

Stop it with Ctrl-C; every request in flight is cancelled and its KV freed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from aiohttp import web

from servelab.server.app import create_app
from servelab.server.config import DEFAULT_MODEL_NAME, ServerConfig
from servelab.server.gate import TenantLimits


def _api_key(text: str) -> tuple[str, str]:
    key, sep, tenant = text.partition("=")
    if not sep or not key or not tenant:
        raise argparse.ArgumentTypeError(f"--api-key must look like KEY=TENANT, got {text!r}")
    return key, tenant


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m servelab.server",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="TCP port")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="Llama checkpoint folder (default: the shipped Shakespeare model)")
    parser.add_argument(
        "--model-name",
        default=None,
        help=f"name clients send as 'model' (default: {DEFAULT_MODEL_NAME}, or the folder name)",
    )
    parser.add_argument(
        "--api-key",
        type=_api_key,
        action="append",
        default=None,
        metavar="KEY=TENANT",
        help="accept this key for this tenant (repeatable); without any, access is open",
    )
    parser.add_argument(
        "--rate", type=float, default=20.0, help="requests/s per tenant (token bucket rate)"
    )
    parser.add_argument(
        "--burst", type=float, default=40.0, help="requests a tenant may send at once"
    )
    parser.add_argument(
        "--token-quota", type=int, default=None, help="tokens per tenant per quota window"
    )
    parser.add_argument(
        "--quota-window", type=float, default=3600.0, help="quota window in seconds"
    )
    parser.add_argument(
        "--max-body-bytes", type=int, default=64 * 1024, help="largest request body"
    )
    parser.add_argument(
        "--max-waiting", type=int, default=64, help="bound of the queue of unscheduled requests"
    )
    parser.add_argument(
        "--queue-timeout", type=float, default=10.0, help="queueing deadline in seconds"
    )
    parser.add_argument(
        "--request-timeout", type=float, default=120.0, help="default and largest deadline_s"
    )
    parser.add_argument(
        "--stream-buffer", type=int, default=64, help="unread chunks per request before cancelling"
    )
    parser.add_argument("--max-num-seqs", type=int, default=None, help="engine batch slots")
    parser.add_argument("--num-blocks", type=int, default=None, help="engine KV blocks")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="engine token budget per step"
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="on CUDA without --num-blocks: fraction in (0, 1] of GPU memory for weights, "
        "activations "
        "and KV cache, the KV pool taking what is left (vLLM serves with 0.9); "
        "default: 0.9, the pool at most --max-num-seqs full-length requests; on the CPU "
        "the pool takes half the available memory up to 4 GiB instead",
    )
    parser.add_argument(
        "--device", default=None, help="torch device (default: cuda if available, else cpu)"
    )
    parser.add_argument(
        "--speculative-config",
        type=_speculative_config,
        default=None,
        metavar="JSON",
        help='speculative decoding, vLLM\'s JSON, e.g. \'{"method": "ngram", '
        '"num_speculative_tokens": 4, "prompt_lookup_max": 3}\' or \'{"method": "draft_model", '
        '"model": "path/to/draft", "num_speculative_tokens": 3}\'',
    )
    return parser


def _speculative_config(text: str) -> dict:
    """``--speculative-config``: a JSON object with vLLM's keys, checked like ``EngineConfig``
    checks it."""
    from servelab.engine.spec_config import speculative_config

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"--speculative-config must be a JSON object: {exc}"
        ) from None
    try:
        speculative_config(value)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


ENGINE_FLAGS = (
    "max_num_seqs",
    "num_blocks",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "device",
    "speculative_config",
)
"""Flags passed on to :class:`~servelab.engine.EngineConfig` (as ``from_pretrained`` keywords) when
given."""


def engine_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """The engine settings the command line gives (flags left out keep the engine's defaults)."""
    return {name: getattr(args, name) for name in ENGINE_FLAGS if getattr(args, name) is not None}


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from servelab.engine import LLMEngine

    # tracing off (the default)
    engine = LLMEngine.from_pretrained(args.model_dir, **engine_kwargs(args))
    name = args.model_name or (args.model_dir.name if args.model_dir else DEFAULT_MODEL_NAME)
    config = ServerConfig(
        model_name=name,
        api_keys=dict(args.api_key) if args.api_key else None,
        tenant_limits=TenantLimits(args.rate, args.burst, args.token_quota, args.quota_window),
        max_body_bytes=args.max_body_bytes,
        max_waiting=args.max_waiting,
        queue_timeout_s=args.queue_timeout,
        request_timeout_s=args.request_timeout,
        stream_buffer_chunks=args.stream_buffer,
    )
    print(engine.kv_pool.describe(), flush=True)  # vLLM logs its KV cache size at start
    print(
        f"serving {name!r} at http://{args.host}:{args.port}/v1, metrics at /metrics (Ctrl-C stops)"
    )
    web.run_app(
        create_app(engine, config),
        host=args.host,
        port=args.port,
        handler_cancellation=True,
        shutdown_timeout=5.0,
        print=None,
    )


if __name__ == "__main__":
    main()
