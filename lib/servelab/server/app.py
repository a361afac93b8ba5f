"""An OpenAI-compatible HTTP server on :class:`servelab.engine.LLMEngine` (aiohttp).

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``.
The subset of the OpenAI API that vLLM and SGLang also serve: ``prompt`` or ``messages``, ``max_tokens``
(``max_completion_tokens`` for chat), ``temperature``, ``top_p``, ``top_k``, ``min_p``,
``presence_penalty``, ``frequency_penalty``, ``repetition_penalty``, ``stop``, ``seed``, ``n``,
``ignore_eos``, ``stream`` and ``stream_options.include_usage``, plus one servelab extension,
``deadline_s`` (seconds; the request ends as timed out when it passes).

A request's path, in order:

1. the ingress gate (:mod:`~servelab.server.gate`), before any tokenization: body size (413), API key
   -> tenant (401), token quota and request rate (429 with Retry-After);
2. parse and validate the body (400 naming the field; 404 for an unknown model);
3. tokenize; check prompt + max_tokens against the context limit (400);
4. submit to the bounded queue of the :class:`~servelab.server.bridge.EngineBridge` (503 with Retry-After
   when the queue is full or the request would miss its deadline); the engine's scheduler then admits it
   with a KV reservation; a request still unscheduled at the queueing deadline gets 503 too;
5. stream server-sent events, or answer one JSON body when ``stream`` is false.

Streaming format: one ``data: {json}`` event per engine step that produced text, per choice; the last
event of each choice carries its ``finish_reason``; with ``stream_options.include_usage`` one more event
with empty ``choices`` carries ``usage`` (OpenAI semantics: without it, a stream has no usage); then
``data: [DONE]``. Response headers are sent with the first token, so a request refused while queued
still gets a proper status code. An error after that point is sent as a ``data: {"error": ...}`` event
followed by ``[DONE]``.

``n`` > 1 runs ``n`` engine requests (the engine samples one sequence per request); with a ``seed``,
choice ``i`` uses ``seed + i``. The prefix cache shares the prompt's KV between them.

Usage: ``prompt_tokens`` counts the prompt once; ``completion_tokens`` counts tokens the engine
*generated* (what was computed and is billed), summed over choices; ``prompt_tokens_details.cached_tokens``
the prefix-cache hit of choice 0; the extension ``servelab_emitted_tokens`` counts the tokens whose text
reached the client (EOS and a stop-string's last token are generated but not emitted).

Chat template (for the course's play-script model): each message becomes ``"NAME:\\n" + content +
"\\n\\n"`` with NAME the message's ``name`` or its role in capitals, and the prompt ends with
``"ASSISTANT:\\n"``. Unless the request sets ``stop``, chat requests stop at ``"\\n\\n"`` (end of turn).

Client disconnects cancel the request in the engine (its KV is freed before the next step); the tenant
is charged the usage generated until then.

System boundary: HTTP on one host; the engine runs in the bridge's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from servelab.engine import LLMEngine, RequestOutput
from servelab.sampling import SamplingParams
from servelab.server.bridge import (BridgeError, EngineBridge, EngineFailure, InvalidRequest, Overloaded, QueueTimeout,
                                    RequestStream, SlowClient)
from servelab.server.gate import IngressGate, Rejection, TenantLimits

__all__ = ["ServerConfig", "create_app", "render_chat", "BackgroundServer", "DEFAULT_MODEL_NAME"]

DEFAULT_MODEL_NAME = "servelab-shakespeare"
CHAT_END_OF_TURN = "\n\n"
MAX_STOP_STRINGS = 4


@dataclass(frozen=True)
class ServerConfig:
    """Server knobs (the engine's own knobs live in :class:`servelab.engine.EngineConfig`).

    ``api_keys`` maps key -> tenant (None: open server, one anonymous tenant); ``tenant_limits`` /
    ``per_tenant_limits`` set rate and quota; ``max_body_bytes`` caps a request body;
    ``max_waiting`` bounds the queue of unscheduled requests and ``queue_timeout_s`` how long one may
    wait there; ``request_timeout_s`` is the default and the largest ``deadline_s``;
    ``stream_buffer_chunks`` bounds undelivered chunks per request: a full buffer pauses the request
    (backpressure) until the reader drains it, and ``backpressure_timeout_s`` later it is cancelled;
    ``max_n`` caps ``n``; ``default_max_tokens`` applies when a request sets none.
    """

    model_name: str = DEFAULT_MODEL_NAME
    api_keys: Mapping[str, str] | None = None
    tenant_limits: TenantLimits = TenantLimits()
    per_tenant_limits: Mapping[str, TenantLimits] = field(default_factory=dict)
    max_body_bytes: int = 64 * 1024
    max_waiting: int = 64
    queue_timeout_s: float = 10.0
    request_timeout_s: float = 120.0
    stream_buffer_chunks: int = 64
    backpressure_timeout_s: float = 30.0
    max_n: int = 8
    default_max_tokens: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.model_name, str) or not self.model_name:
            raise ValueError("model_name must be a non-empty string")
        for name in ("max_n", "default_max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if (isinstance(self.request_timeout_s, bool) or not isinstance(self.request_timeout_s, (int, float))
                or not 0 < self.request_timeout_s < math.inf):
            raise ValueError(f"request_timeout_s must be a finite number > 0, got {self.request_timeout_s!r}")


# ---------------------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class _Parsed:
    """A validated request body."""

    prompt: str
    params: SamplingParams
    stream: bool
    include_usage: bool
    deadline_s: float


def _bad(message: str, param: str | None = None) -> Rejection:
    return Rejection(400, message, "invalid_request_error", param=param)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if not _is_number(value) or not low <= value <= high:
        raise _bad(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}", name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(f"{name} must be an integer in [{low}, {high}], got {value!r}", name)
    return value


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"{name} must be true or false, got {value!r}", name)
    return value


def render_chat(messages: object) -> str:
    """The course model's chat template: ``"NAME:\\ncontent\\n\\n"`` per message, then ``"ASSISTANT:\\n"``."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {role, content} objects", "messages")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _bad(f"messages[{i}] must be an object with role and content", "messages")
        role, content, name = message.get("role"), message.get("content"), message.get("name")
        if role not in ("system", "user", "assistant"):
            raise _bad(f"messages[{i}].role must be 'system', 'user' or 'assistant', got {role!r}", "messages")
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content must be a string", "messages")
        if name is not None and (not isinstance(name, str) or not name.strip() or "\n" in name):
            raise _bad(f"messages[{i}].name must be a one-line non-empty string", "messages")
        turns.append(f"{name or role.upper()}:\n{content}\n\n")
    return "".join(turns) + "ASSISTANT:\n"


def _stop_strings(body: dict, chat: bool) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return (CHAT_END_OF_TURN,) if chat else ()
    stops = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stops, list) or not 0 < len(stops) <= MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stops)):
        raise _bad(f"stop must be a non-empty string or a list of 1 to {MAX_STOP_STRINGS} such strings", "stop")
    return tuple(stops)


def _unsupported(body: dict) -> None:
    for name in ("logprobs", "echo", "suffix", "tools", "response_format", "best_of", "top_logprobs"):
        value = body.get(name)
        if value not in (None, False, 0) and not (name == "best_of" and value == body.get("n", 1)):
            raise _bad(f"{name} is not supported by this server", name)


def _sampling_params(body: dict, chat: bool, config: ServerConfig) -> SamplingParams:
    """The body's sampling fields as :class:`SamplingParams`, range-checked with OpenAI's limits."""
    tokens_field = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    top_k = body.get("top_k")
    if type(top_k) is int and top_k in (-1, 0):
        top_k = None  # vLLM / SGLang spell "no top-k" as -1 (or 0)
    elif top_k is not None:
        top_k = _integer(body, "top_k", None, 1, 1 << 20)
    try:
        return SamplingParams(
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0), top_k=top_k,
            top_p=_number(body, "top_p", 1.0, 0.0, 1.0), min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
            presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, 10.0),
            max_tokens=_integer(body, tokens_field, config.default_max_tokens, 1, 1 << 20),
            stop=_stop_strings(body, chat), ignore_eos=_flag(body, "ignore_eos", False),
            seed=_integer(body, "seed", None, 0, (1 << 63) - 1), n=_integer(body, "n", 1, 1, config.max_n))
    except (ValueError, TypeError) as exc:  # SamplingParams' own checks name the field first
        raise _bad(str(exc), str(exc).split(" ")[0]) from exc


def parse_request(body: object, chat: bool, config: ServerConfig) -> _Parsed:
    """Validate a completions (``chat`` False) or chat-completions body; raises a 4xx :class:`Rejection`."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    if body.get("model") is None:
        raise _bad("model is required", "model")
    if body["model"] != config.model_name:
        raise Rejection(404, f"model {body['model']!r} does not exist; this server serves {config.model_name!r}",
                        "model_not_found", param="model")
    _unsupported(body)
    if chat:
        prompt = render_chat(body.get("messages"))
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise _bad("prompt must be a non-empty string", "prompt")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise _bad("stream_options must be an object", "stream_options")
    return _Parsed(prompt, _sampling_params(body, chat, config), _flag(body, "stream", False),
                   _flag(stream_options, "include_usage", False),
                   _number(body, "deadline_s", config.request_timeout_s, 1e-3, config.request_timeout_s))


# ---------------------------------------------------------------------------------------- responses


def _error(rejection: Rejection) -> web.Response:
    """An OpenAI-style JSON error body with the rejection's status (and Retry-After, whole seconds)."""
    headers = {"WWW-Authenticate": "Bearer"} if rejection.status == 401 else {}
    if rejection.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(rejection.retry_after_s)))
    body = {"error": {"message": rejection.message, "type": rejection.error_type, "param": rejection.param,
                      "code": rejection.status}}
    return web.json_response(body, status=rejection.status, headers=headers)


def _rejection_for(problem: BridgeError | RequestOutput) -> Rejection:
    """The HTTP answer for a request that did not finish normally."""
    if isinstance(problem, RequestOutput):
        if problem.finish_reason == "timed_out":
            return Rejection(504, "the request's deadline passed before it finished", "timeout")
        return Rejection(500, f"the engine ended the request: {problem.finish_reason}", "server_error")
    if isinstance(problem, InvalidRequest):
        return _bad(str(problem))
    if isinstance(problem, QueueTimeout):
        return Rejection(503, str(problem), "overloaded", retry_after_s=problem.retry_after_s)
    if isinstance(problem, SlowClient):
        return Rejection(503, str(problem), "slow_client")
    return Rejection(500 if isinstance(problem, EngineFailure) else 503, str(problem), "server_error")


_OPENAI_FINISH = {"stop": "stop", "eos": "stop", "length": "length"}


def _sse(payload: dict | str) -> bytes:
    """One server-sent event: ``data: <json or literal>`` and the blank line that ends it."""
    return b"data: " + (payload if isinstance(payload, str) else json.dumps(payload)).encode() + b"\n\n"


@dataclass
class _Choice:
    """One choice of a response: its engine stream and what arrived so far."""

    index: int
    stream: RequestStream
    text: list[str] = field(default_factory=list)
    last: RequestOutput | None = None
    problem: BridgeError | RequestOutput | None = None

    @property
    def done(self) -> bool:
        return self.problem is not None or (self.last is not None and self.last.finished)


class _Exchange:
    """One HTTP request's conversation with the engine: its choices, ids and the response envelopes."""

    def __init__(self, parsed: _Parsed, prompt_tokens: int, chat: bool, model: str, streams: list[RequestStream]):
        self.parsed = parsed
        self.prompt_tokens = prompt_tokens
        self.chat = chat
        self.model = model
        self.choices = [_Choice(i, s) for i, s in enumerate(streams)]
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    async def events(self):
        """Yield ``(choice, output_or_error)`` in arrival order across choices until every choice ends.

        One reader task per choice hands items over through a one-slot queue, so an unread output stays
        in its bounded :class:`RequestStream` (and backpressure reaches the engine thread).
        """
        handoff: asyncio.Queue = asyncio.Queue(maxsize=1)

        async def read(choice: _Choice) -> None:
            while True:
                try:
                    item = await choice.stream.next()
                except BridgeError as exc:
                    await handoff.put((choice, exc))
                    return
                await handoff.put((choice, item))
                if item.finished:
                    return

        readers = [asyncio.create_task(read(c)) for c in self.choices]
        try:
            for _ in range(len(self.choices)):
                while True:
                    choice, item = await handoff.get()
                    self._record(choice, item)
                    yield choice, item
                    if choice.done:
                        break
        finally:
            for reader in readers:
                reader.cancel()

    @staticmethod
    def _record(choice: _Choice, item: BridgeError | RequestOutput) -> None:
        if isinstance(item, BridgeError):
            choice.problem = item
            return
        choice.last = item
        choice.text.append(item.delta)
        if item.finished and item.finish_reason not in _OPENAI_FINISH:
            choice.problem = item

    def usage(self) -> dict:
        outputs = [c.last for c in self.choices if c.last is not None]
        generated = sum(o.usage.generated for o in outputs)
        cached = outputs[0].usage.cached_prompt_tokens if outputs else 0
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": generated,
                "total_tokens": self.prompt_tokens + generated, "prompt_tokens_details": {"cached_tokens": cached},
                "servelab_emitted_tokens": sum(o.usage.emitted for o in outputs)}

    def chunk(self, choices: list[dict], usage: dict | None = None) -> bytes:
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return _sse(body)

    def stream_choice(self, index: int, text: str | None, finish_reason: str | None) -> dict:
        if self.chat:
            delta = {} if text is None else {"content": text}
            return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}

    def full_body(self) -> dict:
        choices = []
        for c in self.choices:
            text, reason = "".join(c.text), _OPENAI_FINISH[c.last.finish_reason]
            if self.chat:
                choices.append({"index": c.index, "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": reason})
            else:
                choices.append({"index": c.index, "text": text, "logprobs": None, "finish_reason": reason})
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": self.usage()}


async def _answer_json(exchange: _Exchange) -> web.Response:
    async with contextlib.aclosing(exchange.events()) as events:
        async for choice, _ in events:
            if choice.problem is not None:
                return _error(_rejection_for(choice.problem))
    return web.json_response(exchange.full_body())


async def _answer_stream(request: web.Request, exchange: _Exchange) -> web.StreamResponse:
    events = exchange.events()
    choice, item = await anext(events)
    if choice.problem is not None:  # refused before the first token: a plain error status is still possible
        await events.aclose()
        return _error(_rejection_for(choice.problem))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
        if exchange.chat:
            roles = [{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None} for c in exchange.choices]
            await response.write(exchange.chunk(roles))
        while True:
            if choice.problem is not None:
                error = _rejection_for(choice.problem)
                await response.write(_sse({"error": {"message": error.message, "type": error.error_type,
                                                     "code": error.status}}))
                break
            finish = _OPENAI_FINISH[item.finish_reason] if item.finished else None
            if item.delta or finish:
                await response.write(exchange.chunk([exchange.stream_choice(choice.index, item.delta or None, finish)]))
            try:
                choice, item = await anext(events)
            except StopAsyncIteration:
                if exchange.parsed.include_usage:
                    await response.write(exchange.chunk([], exchange.usage()))
                break
        await response.write(_sse("[DONE]"))
        await response.write_eof()
    except ConnectionError:
        pass  # the client went away mid-stream; the handler's cleanup cancels what is still running
    finally:
        await events.aclose()
    return response


# ---------------------------------------------------------------------------------------- handlers


@dataclass
class _State:
    engine: LLMEngine
    config: ServerConfig
    gate: IngressGate
    bridge: EngineBridge


STATE = web.AppKey("servelab", _State)


async def _read_body(request: web.Request, gate: IngressGate) -> object:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise gate.body_too_large() from None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _bad("the request body is not valid JSON") from None


def _submit(state: _State, prompt_ids: list[int], parsed: _Parsed, tenant: str) -> list[RequestStream]:
    """Queue one engine request per choice; on refusal cancel the ones already queued."""
    streams: list[RequestStream] = []
    params = parsed.params
    try:
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            choice_params = dataclasses.replace(params, n=1, seed=seed)
            streams.append(state.bridge.submit(prompt_ids, choice_params, parsed.deadline_s, namespace=tenant))
    except (Overloaded, EngineFailure):
        for stream in streams:
            state.bridge.cancel(stream.request_id)
        raise
    return streams


async def _completions(request: web.Request, chat: bool) -> web.StreamResponse:
    state = request.app[STATE]
    try:
        tenant = state.gate.admit(request.headers.get("Authorization"), request.content_length)
        parsed = parse_request(await _read_body(request, state.gate), chat, state.config)
        prompt_ids = state.engine.tokenizer.encode(parsed.prompt).ids
        limit = state.engine.max_model_len
        if len(prompt_ids) + parsed.params.max_tokens > limit:
            raise _bad(f"the prompt has {len(prompt_ids)} tokens and max_tokens is {parsed.params.max_tokens}; "
                       f"together they exceed the context limit of {limit} tokens", "max_tokens")
        streams = _submit(state, prompt_ids, parsed, tenant)
    except Rejection as rejection:
        return _error(rejection)
    except Overloaded as exc:
        return _error(Rejection(503, exc.message, "overloaded", retry_after_s=exc.retry_after_s))
    except EngineFailure as exc:
        return _error(Rejection(503, str(exc), "server_error", retry_after_s=1.0))
    exchange = _Exchange(parsed, len(prompt_ids), chat, state.config.model_name, streams)
    try:
        if parsed.stream:
            return await _answer_stream(request, exchange)
        return await _answer_json(exchange)
    finally:  # every exit path, disconnects (CancelledError) included
        for choice in exchange.choices:
            if not choice.done:
                state.bridge.cancel(choice.stream.request_id)
        if any(c.last is not None for c in exchange.choices):
            state.gate.charge(tenant, exchange.usage()["total_tokens"])


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _completions(request, chat=True)


async def _text(request: web.Request) -> web.StreamResponse:
    return await _completions(request, chat=False)


async def _models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"object": "list", "data": [{
        "id": state.config.model_name, "object": "model", "created": 0, "owned_by": "servelab",
        "max_model_len": state.engine.max_model_len}]})


async def _health(request: web.Request) -> web.Response:
    bridge = request.app[STATE].bridge
    if not bridge.alive:
        detail = repr(bridge.failure) if bridge.failure else "engine thread not running"
        return web.json_response({"status": "unavailable", "detail": detail}, status=503)
    return web.json_response({"status": "ok", "waiting": bridge.num_waiting,
                              "queue_delay_ewma_s": round(bridge.queue_delay_ewma_s, 4)})


def create_app(engine: LLMEngine, config: ServerConfig | None = None) -> web.Application:
    """The aiohttp application serving ``engine``; the engine thread starts and stops with the app."""
    config = ServerConfig() if config is None else config
    if not isinstance(config, ServerConfig):
        raise TypeError(f"config must be a ServerConfig, got {type(config).__name__}")
    gate = IngressGate(config.api_keys, config.tenant_limits, config.per_tenant_limits, config.max_body_bytes)
    bridge = EngineBridge(engine, config.max_waiting, config.queue_timeout_s, config.stream_buffer_chunks,
                          config.backpressure_timeout_s)
    app = web.Application(client_max_size=config.max_body_bytes)
    app[STATE] = _State(engine, config, gate, bridge)

    async def start_engine(app: web.Application) -> None:
        bridge.start(asyncio.get_running_loop())

    async def stop_engine(app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, bridge.stop)

    app.on_startup.append(start_engine)
    app.on_shutdown.append(stop_engine)
    app.router.add_post("/v1/completions", _text)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    return app


class BackgroundServer:
    """Serve ``engine`` over HTTP from a background thread with its own event loop (tests, notebooks).

    ``port=0`` picks a free port; :attr:`url` is then the base URL ending in ``/v1``. Use as a context
    manager, or call :meth:`close`.
    """

    def __init__(self, engine: LLMEngine, config: ServerConfig | None = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.app = create_app(engine, config)
        self.engine = engine
        self.host = host
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(self.app, handler_cancellation=True, shutdown_timeout=5.0)
        self._thread = threading.Thread(target=self._loop.run_forever, name="servelab-http", daemon=True)
        self._thread.start()
        try:
            self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        except BaseException:
            self._stop_loop()
            raise

    async def _start(self) -> int:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port)
        await site.start()
        return self._runner.addresses[0][1]

    @property
    def url(self) -> str:
        """Base URL of the OpenAI-compatible API, e.g. ``http://127.0.0.1:41234/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def bridge(self) -> EngineBridge:
        return self.app[STATE].bridge

    @property
    def gate(self) -> IngressGate:
        return self.app[STATE].gate

    def call(self, fn: Callable[[LLMEngine], Any], timeout_s: float = 30.0) -> Any:
        """Run ``fn(engine)`` on the engine thread between steps (safe inspection); blocks for the result."""
        return asyncio.run_coroutine_threadsafe(self.bridge.call(fn), self._loop).result(timeout=timeout_s)

    def close(self) -> None:
        """Stop serving: cancel what runs, stop the engine thread and the event loop."""
        if self._loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> "BackgroundServer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
