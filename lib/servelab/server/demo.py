"""The course server as the book shows it: started on loopback, seen on the wire, measured at two
boundaries.

* :func:`course_server` starts the server for the shipped Shakespeare model (or any engine) on
  127.0.0.1 with a free port, in a background thread, and stops it cleanly on exit (a context
  manager).
* :func:`raw_exchange` sends one streamed request over a plain socket and returns the exchange as
  text: the request line, headers and body, then the response's status line and headers, and its
  ``data:`` events through ``data: [DONE]``, exactly as they crossed the wire (chunked framing
  removed).
* :func:`openai_stream` streams the same request with the official ``openai`` client.
* :func:`ttft_at_two_boundaries` runs a short open-loop load-generator run and sets the TTFT the
  client measured beside the TTFT the server measured (its ``/metrics`` histogram) for the same
  requests.

System boundary: one host, loopback TCP. Times are seconds (the tables show milliseconds).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import json
import socket
from collections.abc import Iterator, Mapping

import numpy as np

from servelab._validate import require_int, require_real
from servelab.engine import LLMEngine
from servelab.loadgen import (
    Endpoint,
    LengthDistribution,
    build_workload,
    histogram_delta,
    latency_ms,
    metrics_url,
    poisson_arrivals,
    run_open_loop,
    run_with_metrics,
)
from servelab.metrics.latency import percentile
from servelab.server.app import BackgroundServer
from servelab.server.config import ServerConfig

__all__ = [
    "course_server",
    "raw_exchange",
    "stream_text",
    "openai_stream",
    "ttft_at_two_boundaries",
]

EXCHANGE_TIMEOUT_S = 60.0


@contextlib.contextmanager
def course_server(engine: LLMEngine | None = None, **config) -> Iterator[BackgroundServer]:
    """Serve ``engine`` (default: the shipped model) on ``127.0.0.1`` at a free port until the block
    ends.

    ``config`` are :class:`~servelab.server.ServerConfig` fields. The server runs in a background
    thread with its own event loop; leaving the block cancels what is still running and stops it.
    """
    engine = LLMEngine.from_pretrained() if engine is None else engine
    with BackgroundServer(engine, ServerConfig(**config), host="127.0.0.1", port=0) as server:
        yield server


def _request_bytes(server: BackgroundServer, path: str, body: Mapping) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {server.host}:{server.port}\r\nContent-Type: "
        f"application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + payload


def _read_response(sock: socket.socket) -> tuple[str, list[str]]:
    """Status line + headers as text, and the body's lines (``http.client`` removes the chunked
    framing)."""
    response = http.client.HTTPResponse(sock)
    response.begin()
    head = [f"HTTP/1.1 {response.status} {response.reason}"] + [
        f"{k}: {v}" for k, v in response.getheaders()
    ]
    lines = []
    while True:
        line = response.readline()
        if not line:
            break
        lines.append(line.decode().rstrip("\n"))
        if line.startswith(b"data: [DONE]"):
            break
    response.close()
    return "\n".join(head), lines


def raw_exchange(server: BackgroundServer, body: Mapping, path: str = "/v1/completions",
                 max_events: int = 8) -> str:
    """One request as it crosses the wire, as text: what the client sent, then what came back.

    ``body`` should set ``"stream": true``. Of a long stream, the first ``max_events - 2`` and the
    last two ``data:`` events are kept and the middle is replaced by a ``...`` line saying how many
    were left out. The blank lines that end each event are kept, as on the wire.
    """
    require_int("max_events", max_events, 3)
    request = _request_bytes(server, path, body)
    with socket.create_connection((server.host, server.port), timeout=EXCHANGE_TIMEOUT_S) as sock:
        sock.sendall(request)
        head, lines = _read_response(sock)
    events = [i for i, line in enumerate(lines) if line.startswith("data: ")]
    if len(events) > max_events:
        keep_to, resume = events[max_events - 3] + 2, events[-2]
        skipped = len(events) - max_events
        lines = (
            lines[:keep_to]
            + [f"... ({skipped} more data: event{'s' * (skipped > 1)}) ...", ""]
            + lines[resume:]
        )
    sent = request.decode().replace("\r\n", "\n")
    return f"{sent}\n\n{head}\n\n" + "\n".join(lines)


def stream_text(exchange: str) -> str:
    """The generated text carried by the (unabridged) completion events of a
    :func:`raw_exchange`."""
    pieces = []
    for line in exchange.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[len("data: "):]).get("choices") or []:
                pieces.append(
                    choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                )
    return "".join(pieces)


def openai_stream(server: BackgroundServer, prompt: str, max_tokens: int = 24, seed: int = 0,
                  **params) -> list[str]:
    """Stream a completion with the official ``openai`` client; returns its text chunks in arrival
    order.

    ``params`` are further request fields (``temperature``, ``stop``, ...).
    """
    import openai  # an optional dependency: only this demo needs it

    client = openai.OpenAI(
        base_url=server.url,
        api_key="sk-course",
        max_retries=0,
        timeout=EXCHANGE_TIMEOUT_S,
        http_client=openai.DefaultHttpxClient(trust_env=False),
    )
    try:
        stream = client.completions.create(model=server.config.model_name, prompt=prompt,
                                           max_tokens=max_tokens, seed=seed, stream=True, **params)
        return [
            chunk.choices[0].text for chunk in stream if chunk.choices and chunk.choices[0].text
        ]
    finally:
        client.close()


def _client_row(ttfts: list[float]) -> dict:
    return {"boundary": "client: request sent -> first chunk parsed", "requests": len(ttfts),
            "mean_ms": 1000 * float(np.mean(ttfts)), "p50_ms": 1000 * percentile(ttfts, 50).value,
            "p90_ms": 1000 * percentile(ttfts, 90).value}


def run_to_completion(coroutine):
    """Run ``coroutine`` and return its result, also where an event loop is already running (a
    Jupyter kernel runs cells inside one, so ``asyncio.run`` would refuse): then it runs in a worker
    thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def ttft_at_two_boundaries(
    server: BackgroundServer,
    rate: float = 8.0,
    duration_s: float = 4.0,
    seed: int = 0,
    prompt_words: int = 12,
    max_tokens: int = 16,
) -> list[dict]:
    """TTFT of the same requests seen from the client and from the server, in milliseconds.

    Runs an open loop of Poisson arrivals (``rate`` requests/s for ``duration_s`` s, seeded) against
    ``server`` and scrapes its ``/metrics`` before and after, so the histogram's gain covers exactly
    these requests (on a server nobody else uses). Rows: the client's TTFT (from the send to the
    first content chunk parsed; exact percentiles) and the server's (from queueing to the engine to
    the first token handed out; the mean is exact, the percentiles are interpolated inside histogram
    buckets). The difference of the means is the mean time spent between the two boundaries: HTTP,
    JSON parsing, tokenization, the SSE write, loopback TCP and the client's own parsing.
    """
    require_real("rate", rate, 0.0, strict_min=True)
    require_real("duration_s", duration_s, 0.0, strict_min=True)
    rng = np.random.default_rng(seed)
    specs = build_workload(
        poisson_arrivals(rate, duration_s, rng),
        LengthDistribution(prompt_words, 0.0, 1, 512),
        LengthDistribution(max_tokens, 0.0, 1, 4096),
        seed,
    )
    endpoint = Endpoint(server.url, server.config.model_name, ignore_eos=True)
    run, snapshots = run_to_completion(
        run_with_metrics(run_open_loop(endpoint, specs), metrics_url(server.url))
    )
    ok = [r for r in run.results if r.ok]
    if len(ok) != len(run.results):
        failed = next(r for r in run.results if not r.ok)
        raise RuntimeError(f"{len(run.results) - len(ok)} requests failed, e.g. {failed.error}")
    client = _client_row([r.emit_s[0] - r.sent_s for r in ok])
    hist = histogram_delta(snapshots[0], snapshots[-1], "servelab:time_to_first_token_seconds",
                           model_name=server.config.model_name)
    return [
        client,
        {"boundary": "server: queued to the engine -> first token handed out", **latency_ms(hist)},
    ]
