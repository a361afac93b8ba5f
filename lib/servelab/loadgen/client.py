"""The load generator's HTTP side: send planned requests to an OpenAI-compatible server and time
them.

Two ways to drive load:

* :func:`run_open_loop` sends every request at its planned instant, whether or not earlier ones have
  finished (arrivals do not wait for the server, as with independent users);
* :func:`run_closed_loop` keeps a fixed number of requests in flight; each worker sends its next
  request when the previous one ends (and not before that request's planned instant, if it has one).

Coordinated omission: when a server stalls, a closed loop stops sending, so the requests that
*would* have arrived during the stall are never measured, and the stall shows up as one slow request
instead of many. Every :class:`RequestResult` therefore keeps both the planned instant and the
actual send instant; latency measured from the plan charges the stall to every request that should
have arrived during it. Measured from the send it is the naive (optimistic) number.

System boundary: the client. Each emit instant is when one streamed content chunk (a ``data:`` event
with non-empty text) was parsed here, so it includes network transit and the server's buffering; our
server and vLLM/SGLang stream one token per chunk, so chunks stand in for tokens. Times are seconds
since the run started (``time.perf_counter``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from servelab._validate import require_real
from servelab.loadgen.workload import RequestSpec
from servelab.metrics.latency import RequestTiming

__all__ = [
    "Endpoint",
    "RequestResult",
    "RunResult",
    "send_request",
    "run_open_loop",
    "run_closed_loop",
]


@dataclass(frozen=True)
class Endpoint:
    """Where and how to send: base URL ending in ``/v1``, model name, optional API key.

    ``chat`` selects ``/chat/completions`` (one user message) instead of ``/completions``;
    ``ignore_eos`` asks the server to generate exactly ``max_tokens`` (a vLLM/SGLang/servelab
    extension field); ``timeout_s`` bounds each request end to end.
    """

    url: str
    model: str
    api_key: str | None = None
    chat: bool = False
    ignore_eos: bool = True
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a non-empty string")
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, (int, float))
            or not self.timeout_s > 0
        ):
            raise ValueError(f"timeout_s must be a number > 0, got {self.timeout_s!r}")

    @property
    def path(self) -> str:
        return self.url.rstrip("/") + ("/chat/completions" if self.chat else "/completions")

    def body(self, spec: RequestSpec) -> dict:
        """The JSON request body for ``spec``: streaming, with the usage record in the last
        chunk."""
        body = {"model": self.model, "max_tokens": spec.max_tokens, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": 1.0, "seed": spec.index}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.chat:
            body["messages"] = [{"role": "user", "content": spec.prompt}]
        else:
            body["prompt"] = spec.prompt
        return body

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class RequestResult:
    """What the client saw of one request (seconds since the run started).

    ``status`` is the HTTP status (0 when no response arrived); ``error`` explains a failure (an
    error status, an error event in the stream, a broken connection or the timeout).
    ``prompt_tokens``/``completion_tokens`` come from the server's usage record when it sent one.
    """

    index: int
    planned_s: float | None
    sent_s: float
    emit_s: tuple[float, ...]
    finish_s: float
    status: int
    error: str | None = None
    retry_after_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""

    @property
    def ok(self) -> bool:
        """A 200 response that streamed at least one content chunk and ended without an error."""
        return self.status == 200 and self.error is None and bool(self.emit_s)

    @property
    def arrival_s(self) -> float:
        """The instant latency is measured from: the plan when there is one, else the send."""
        return self.sent_s if self.planned_s is None else self.planned_s

    def timing(self, from_planned: bool = True) -> RequestTiming:
        """This request as a :class:`servelab.metrics.latency.RequestTiming` (successful requests
        only).

        ``from_planned=False`` measures from the actual send: the naive, coordinated-omission-prone
        view. The client cannot see the server's scheduler, so ``first_scheduled`` is the send
        instant.
        """
        if not self.ok:
            raise ValueError(
                f"request {self.index} failed ({self.error or self.status}); it has no timing"
            )
        arrival = self.arrival_s if from_planned else self.sent_s
        return RequestTiming(arrival=min(arrival, self.sent_s), first_scheduled=self.sent_s,
                             emit_times=self.emit_s, finish=self.finish_s,
                             prompt_tokens=self.prompt_tokens or 0)


@dataclass(frozen=True)
class RunResult:
    """All results of one run, in request order, plus how it was driven.

    ``mode`` is ``"open"`` or ``"closed"``; ``offered_rate`` is requests/s of the plan (None for an
    unpaced closed loop); ``wall_s`` runs from the start to the last finish; ``unsent`` counts
    requests dropped because the run hit its time limit.
    """

    mode: str
    results: tuple[RequestResult, ...]
    offered_rate: float | None
    concurrency: int | None
    wall_s: float
    unsent: int = 0

    @property
    def max_send_lag_s(self) -> float:
        """Largest gap between a planned and an actual send: the client's own lateness (0 with no
        plan).

        A large value in an open loop means the load generator itself could not keep up.
        """
        lags = [r.sent_s - r.planned_s for r in self.results if r.planned_s is not None]
        return max(lags, default=0.0)


def _now(t0: float) -> float:
    return time.perf_counter() - t0


def _chunk_text(event: dict, chat: bool) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if chat:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def _retry_after(headers) -> float | None:
    value = headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


async def _read_error(resp: aiohttp.ClientResponse) -> str:
    body = await resp.text()
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body[:200] or resp.reason or "error"


async def send_request(session: aiohttp.ClientSession, endpoint: Endpoint, spec: RequestSpec,
                       t0: float) -> RequestResult:
    """Send ``spec`` now, read the server-sent-event stream to its end and time every content chunk.

    Never raises for server or network trouble: those become a failed :class:`RequestResult`.
    """
    sent = _now(t0)
    emits: list[float] = []
    text: list[str] = []
    state = {"status": 0, "error": None, "retry": None, "usage": None, "finish": None}
    try:
        async with session.post(endpoint.path, json=endpoint.body(spec), headers=endpoint.headers(),
                                timeout=aiohttp.ClientTimeout(total=endpoint.timeout_s)) as resp:
            state["status"] = resp.status
            if resp.status != 200:
                state["retry"] = _retry_after(resp.headers)
                state["error"] = f"HTTP {resp.status}: {await _read_error(resp)}"
            else:
                await _read_stream(resp, endpoint.chat, t0, emits, text, state)
    except asyncio.TimeoutError:
        state["error"] = f"no complete answer within {endpoint.timeout_s} s"
    except aiohttp.ClientError as exc:
        state["error"] = f"connection failed: {exc.__class__.__name__}: {exc}"
    except ValueError as exc:  # an event that is not JSON (or not UTF-8)
        state["error"] = f"malformed stream: {exc}"
    usage = state["usage"] or {}
    return RequestResult(
        index=spec.index,
        planned_s=spec.planned_s,
        sent_s=sent,
        emit_s=tuple(emits),
        finish_s=_now(t0),
        status=state["status"],
        error=state["error"],
        retry_after_s=state["retry"],
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        finish_reason=state["finish"],
        text="".join(text),
    )


async def _read_stream(resp: aiohttp.ClientResponse, chat: bool, t0: float, emits: list[float],
                       text: list[str], state: dict) -> None:
    """Parse ``data:`` lines until ``[DONE]``; fill ``emits``/``text`` and the usage/finish/error
    state.

    A stream that closes without ``[DONE]`` is complete when a chunk carried a ``finish_reason``
    (transformers' ``transformers serve`` ends that way); without either it was cut off.
    """
    async for raw in resp.content:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue  # blank separators and SSE comments
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            return
        event = json.loads(payload)
        if "error" in event:
            state["error"] = f"stream error: {event['error'].get('message', event['error'])}"
            return
        piece = _chunk_text(event, chat)
        if piece:
            emits.append(_now(t0))
            text.append(piece)
        for choice in event.get("choices") or []:
            state["finish"] = choice.get("finish_reason") or state["finish"]
        if event.get("usage"):
            state["usage"] = event["usage"]
    if state["finish"] is None:
        state["error"] = "stream ended without [DONE] or a finish_reason"


def _check_specs(specs: Sequence[RequestSpec]) -> list[RequestSpec]:
    specs = list(specs)
    if not specs or not all(isinstance(s, RequestSpec) for s in specs):
        raise ValueError("specs must be a non-empty sequence of RequestSpec")
    return specs


def _offered_rate(specs: list[RequestSpec]) -> float | None:
    planned = [s.planned_s for s in specs if s.planned_s is not None]
    if len(planned) < 2 or planned[-1] <= planned[0]:
        return None
    return (len(planned) - 1) / (planned[-1] - planned[0])


async def run_open_loop(endpoint: Endpoint, specs: Sequence[RequestSpec], max_in_flight: int = 256,
                        time_limit_s: float = 300.0) -> RunResult:
    """Send each request at its planned instant, independent of earlier ones; wait for all to end.

    ``max_in_flight`` caps open connections (a protection for the client, not part of the model of
    traffic): a request that finds the cap full is sent late, and its latency is still measured from
    its plan. Requests not sent within ``time_limit_s`` are dropped and counted in ``unsent``.
    """
    specs = _check_specs(specs)
    if any(s.planned_s is None for s in specs):
        raise ValueError("an open loop needs a planned instant for every request (planned_s)")
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ValueError(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
    limit = float(require_real("time_limit_s", time_limit_s, 0, strict_min=True))
    slots = asyncio.Semaphore(max_in_flight)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max_in_flight)
    ) as session:
        t0 = time.perf_counter()

        async def one(spec: RequestSpec) -> RequestResult:
            try:
                return await send_request(session, endpoint, spec, t0)
            finally:
                slots.release()

        tasks = []
        for spec in specs:
            if spec.planned_s > limit:
                break
            await asyncio.sleep(max(0.0, spec.planned_s - _now(t0)))
            await slots.acquire()
            tasks.append(asyncio.create_task(one(spec)))
        results = await asyncio.gather(*tasks)
        wall = _now(t0)
    return RunResult(
        "open", tuple(results), _offered_rate(specs), None, wall, unsent=len(specs) - len(tasks)
    )


async def run_closed_loop(endpoint: Endpoint, specs: Sequence[RequestSpec], concurrency: int,
                          time_limit_s: float = 300.0) -> RunResult:
    """Keep ``concurrency`` requests in flight until every spec was sent or ``time_limit_s`` passed.

    A worker takes the next spec when its previous request ends, waits for the spec's planned
    instant if it has one, and sends it. With planned instants (a *paced* closed loop) the result
    can be read both ways: from the plan (corrected) or from the send (naive).
    """
    specs = _check_specs(specs)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
    limit = float(require_real("time_limit_s", time_limit_s, 0, strict_min=True))
    queue = list(reversed(specs))
    results: list[RequestResult] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        t0 = time.perf_counter()

        async def worker() -> None:
            while queue and _now(t0) < limit:
                spec = queue.pop()
                if spec.planned_s is not None:
                    await asyncio.sleep(max(0.0, spec.planned_s - _now(t0)))
                results.append(await send_request(session, endpoint, spec, t0))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = _now(t0)
    results.sort(key=lambda r: r.index)
    return RunResult(
        "closed", tuple(results), _offered_rate(specs), concurrency, wall, unsent=len(queue)
    )
