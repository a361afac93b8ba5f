"""An OpenAI-compatible HTTP server on :class:`servelab.engine.LLMEngine` (aiohttp).

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET
/v1/models/{id}``, ``GET /health``, ``GET /metrics`` (Prometheus text format), and vLLM's ``POST
/tokenize``, ``POST /detokenize`` and ``GET /version`` (:mod:`~servelab.server.utility`). The subset
of the OpenAI API that vLLM and SGLang also serve: ``prompt`` (a string, strings, token ids or lists
of them) or ``messages``, ``max_tokens`` (``max_completion_tokens`` for chat), ``temperature``,
``top_p``, ``top_k``, ``min_p``, ``presence_penalty``, ``frequency_penalty``,
``repetition_penalty``, ``logit_bias``, ``stop``, ``seed``, ``n``, ``ignore_eos``, ``stream`` and
``stream_options.include_usage``, ``logprobs`` (completions: 0-5 alternatives; chat: ``logprobs:
true`` + ``top_logprobs`` 0-20) and ``echo`` (completions; with ``max_tokens: 0`` it scores the
prompt; see :mod:`~servelab.server.logprobs`), structured outputs (``response_format``
``json_object`` / ``json_schema``, vLLM's ``guided_json`` / ``guided_choice`` / ``guided_regex``;
:mod:`servelab.sampling.grammar`; a grammar that does not compile is a 400 naming its field), plus
one servelab extension, ``deadline_s`` (seconds; the request ends as timed out when it passes). A
field the server cannot honour (``tools``, ``suffix``, ...) is refused with a 400, never silently
ignored.

A request's path, in order:

1. the ingress gate (:mod:`~servelab.server.gate`), before any tokenization: body size (413), API
   key -> tenant (401), token quota and request rate (429 with Retry-After);
2. parse and validate the body (:mod:`~servelab.server.protocol`: bounded JSON, a 400 naming the
   field; 404 for an unknown model);
3. tokenize; check prompt + max_tokens against the context limit (400);
4. submit one engine request per prompt to the bounded queue of the
   :class:`~servelab.server.bridge.EngineBridge` (503 with Retry-After when the queue is full or the
   request would miss its deadline); ``n`` > 1 is the engine's own parallel sampling (the prompt is
   prefilled once and forked; sample ``j`` uses ``seed + j``); a request still unscheduled at the
   queueing deadline gets 503 too;
5. stream server-sent events, or answer one JSON body (:mod:`~servelab.server.responses`). Response
   headers are sent with the first token, so a request refused while queued still gets a status
   code.

Every error, unknown routes, wrong methods and oversized bodies included, is a JSON body in OpenAI's
shape (a middleware turns aiohttp's own 404/405/413 into it); a client's mistake is never a 5xx.

Chat template (for the course's play-script model): each message becomes ``"NAME:\\n" + content +
"\\n\\n"`` with NAME the message's ``name`` or its role in capitals, and the prompt ends with
``"ASSISTANT:\\n"``. Unless the request sets ``stop``, chat requests stop at ``"\\n\\n"`` (end of
turn).

Client disconnects cancel the request in the engine (its KV is freed before the next step); the
tenant is charged the usage generated until then.

System boundary: HTTP on one host; the engine runs in the bridge's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from servelab.engine import LLMEngine
from servelab.sampling.grammar import SharedCompiler
from servelab.sampling import SamplingParams
from servelab.server.bridge import EngineBridge, EngineFailure, Overloaded, RequestStream
from servelab.server.config import ServerConfig
from servelab.server.gate import IngressGate, Rejection
from servelab.server.logprobs import LogprobFormatter
from servelab.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from servelab.server.protocol import ParsedRequest, bad, parse_json, parse_request, render_chat
from servelab.server.responses import Exchange, error_response, rejection_for, sse
from servelab.server.utility import add_utility_routes

__all__ = ["create_app", "render_chat", "BackgroundServer"]

_log = logging.getLogger(__name__)
METRICS_TIMEOUT_S = 5.0  # how long a scrape waits for the engine thread to finish its step


# ---------------------------------------------------------------------------------------- answers


async def _answer_json(exchange: Exchange) -> web.Response:
    async with contextlib.aclosing(exchange.events()) as events:
        async for prompt, _ in events:
            if prompt.problem is not None:
                return error_response(rejection_for(prompt.problem))
    return web.json_response(exchange.full_body())


def _error_event(problem) -> bytes:
    error = rejection_for(problem)
    return sse({"error": {"message": error.message, "type": error.error_type, "param": error.param,
                          "code": error.code}})


async def _answer_stream(request: web.Request, exchange: Exchange) -> web.StreamResponse:
    events = exchange.events()
    prompt, moved = await anext(events)
    # refused before the first token: a plain error status is still possible
    if prompt.problem is not None:
        await events.aclose()
        return error_response(rejection_for(prompt.problem))
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    try:
        await response.prepare(request)
        if exchange.chat:
            await response.write(exchange.role_chunk())
        while True:
            if prompt.problem is not None:
                await response.write(_error_event(prompt.problem))
                break
            for move in moved:
                await response.write(exchange.chunk([exchange.stream_choice(move)]))
            try:
                prompt, moved = await anext(events)
            except StopAsyncIteration:
                if exchange.include_usage:
                    await response.write(exchange.chunk([], exchange.usage()))
                break
        await response.write(sse("[DONE]"))
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
    metrics: ServerMetrics
    vocab_size: int | None
    kv_capacity_tokens: int  # tokens the whole KV pool holds: no sequence can be longer
    formatter: LogprobFormatter
    grammars: SharedCompiler


STATE = web.AppKey("servelab", _State)


async def _read_body(request: web.Request, gate: IngressGate) -> object:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise gate.body_too_large() from None
    return parse_json(raw)


def _encode(
    state: _State, prompt: str | tuple[int, ...], add_special_tokens: bool = True
) -> list[int]:
    """Prompt ids. A chat rendered by the checkpoint's template is encoded with
    ``add_special_tokens`` False, as ``apply_chat_template(tokenize=True)`` does: the template
    already wrote any BOS."""
    if isinstance(prompt, tuple):
        return list(prompt)
    return state.engine.tokenizer.encode(prompt, add_special_tokens=add_special_tokens).ids


def _fit_context(
    state: _State, parsed: ParsedRequest, prompt_ids: list[list[int]], chat: bool
) -> SamplingParams:
    """The request's params with ``max_tokens`` checked against (or, for chat, defaulted to) the
    context."""
    limit = min(state.engine.max_model_len, state.kv_capacity_tokens)
    params = parsed.params
    longest = max(len(ids) for ids in prompt_ids)
    if chat and not parsed.max_tokens_given:
        room = limit - longest
        if room < 1:
            raise bad(
                f"the prompt has {longest} tokens, which leaves no room in the context limit of "
                f"{limit} tokens",
                "messages",
            )
        return dataclasses.replace(params, max_tokens=room)
    if longest + params.max_tokens > limit:
        raise bad(f"the prompt has {longest} tokens and max_tokens is {params.max_tokens}; "
                  f"together they exceed the context limit of {limit} tokens", "max_tokens")
    return params


def _submit(state: _State, prompt_ids: list[list[int]], params: SamplingParams, deadline_s: float,
            tenant: str) -> list[RequestStream]:
    """Queue one engine request per prompt (the engine forks it into ``n`` samples); on refusal
    cancel the ones already queued."""
    streams: list[RequestStream] = []
    try:
        for ids in prompt_ids:
            streams.append(state.bridge.submit(ids, params, deadline_s, namespace=tenant))
    except (Overloaded, EngineFailure):
        for stream in streams:
            state.bridge.cancel(stream.request_id)
        raise
    return streams


async def _compile_grammar(state: _State, parsed: ParsedRequest) -> object | None:
    """The request's structured-output grammar, compiled off the event loop (None without one); its
    compile time goes to its own histogram, not into TTFT (the engine has not seen the request
    yet)."""
    if parsed.grammar is None:
        return None
    start = time.perf_counter()
    try:
        compiled = await asyncio.get_running_loop().run_in_executor(
            None, state.grammars.compile, parsed.grammar
        )
    except ValueError as exc:
        raise bad(
            f"{parsed.grammar_param} cannot be compiled into a grammar: {exc}", parsed.grammar_param
        ) from exc
    state.metrics.grammar_compile.observe(time.perf_counter() - start)
    return compiled


def _admit(state: _State, parsed: ParsedRequest, chat: bool, tenant: str, grammar: object | None
           ) -> tuple[Exchange, bool]:
    """Phase 2: tokenize, fit the context and queue; returns the exchange and whether to stream.

    Raises :class:`Rejection`, ``Overloaded`` or ``EngineFailure``.
    """
    templated = chat and state.engine.chat_template is not None
    prompt_ids = [_encode(state, p, add_special_tokens=not templated) for p in parsed.prompts]
    params = _fit_context(state, parsed, prompt_ids, chat)
    if grammar is not None:
        params = dataclasses.replace(params, grammar=grammar)
    echo_texts = (
        [
            p if isinstance(p, str) else state.engine.tokenizer.decode(list(p))
            for p in parsed.prompts
        ]
        if parsed.echo
        else None
    )
    streams = _submit(state, prompt_ids, params, parsed.deadline_s, tenant)
    return Exchange(
        streams,
        prompt_ids,
        params.n,
        chat,
        state.config.model_name,
        parsed.stream and parsed.include_usage,
        state.formatter,
        parsed.logprobs,
        echo_texts,
        parsed.score_only,
    ), parsed.stream


async def _completions(request: web.Request, chat: bool) -> web.StreamResponse:
    state = request.app[STATE]
    try:
        tenant = state.gate.admit(request.headers.get("Authorization"), request.content_length)
        parsed = parse_request(
            await _read_body(request, state.gate),
            chat,
            state.config,
            state.vocab_size,
            state.engine.chat_template,
            state.engine.default_sampling,
        )
        exchange, stream = _admit(
            state, parsed, chat, tenant, await _compile_grammar(state, parsed)
        )
    except Rejection as rejection:
        return error_response(rejection)
    except Overloaded as exc:
        return error_response(
            Rejection(
                503, exc.message, "server_error", retry_after_s=exc.retry_after_s, code="overloaded"
            )
        )
    except EngineFailure as exc:
        return error_response(
            Rejection(503, str(exc), "server_error", retry_after_s=1.0, code="engine_failure")
        )
    try:
        if stream:
            return await _answer_stream(request, exchange)
        return await _answer_json(exchange)
    finally:  # every exit path, disconnects (CancelledError) included
        for prompt in exchange.prompts:
            if not prompt.done:
                state.bridge.cancel(prompt.stream.request_id)
        if any(p.last is not None for p in exchange.prompts):
            state.gate.charge(tenant, exchange.usage()["total_tokens"])


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _completions(request, chat=True)


async def _text(request: web.Request) -> web.StreamResponse:
    return await _completions(request, chat=False)


def _model_card(state: _State) -> dict:
    return {"id": state.config.model_name, "object": "model", "created": 0, "owned_by": "servelab",
            "max_model_len": state.engine.max_model_len}


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [_model_card(request.app[STATE])]})


async def _model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    name = request.match_info["model"]
    if name != state.config.model_name:
        return error_response(
            Rejection(
                404,
                f"model {ascii(name)} does not exist; this server serves "
                f"{state.config.model_name!r}",
                "not_found_error",
                param="model",
                code="model_not_found",
            )
        )
    return web.json_response(_model_card(state))


async def _health(request: web.Request) -> web.Response:
    bridge = request.app[STATE].bridge
    if not bridge.alive:
        detail = repr(bridge.failure) if bridge.failure else "engine thread not running"
        return web.json_response({"status": "unavailable", "detail": detail}, status=503)
    return web.json_response({"status": "ok", "waiting": bridge.num_waiting,
                              "queue_delay_ewma_s": round(bridge.queue_delay_ewma_s, 4)})


async def _metrics(request: web.Request) -> web.Response:
    """Prometheus text format; the engine gauges are read between two steps (on the engine
    thread)."""
    state = request.app[STATE]
    # a dead engine: the counters still answer
    with contextlib.suppress(EngineFailure, asyncio.TimeoutError):
        state.metrics.set_engine_stats(
            await asyncio.wait_for(state.bridge.call(LLMEngine.stats), METRICS_TIMEOUT_S)
        )
    return web.Response(body=state.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


_HTTP_ERRORS = {
    404: ("not_found_error", "unknown_url"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
}


@web.middleware
async def openai_errors(request: web.Request, handler) -> web.StreamResponse:
    """Answer aiohttp's own errors (unknown route, wrong method, body too large, ...) and any bug in
    OpenAI's JSON error shape instead of plain text."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error_type, code = _HTTP_ERRORS.get(exc.status, ("invalid_request_error" if exc.status < 500
                                                         else "server_error", None))
        message = f"{exc.reason}: {request.method} {request.path}"
        response = error_response(Rejection(exc.status, message, error_type, code=code))
        if exc.status == 405 and "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:  # a bug: still a JSON answer, and logged
        _log.exception("unhandled error serving %s %s", request.method, request.path)
        return error_response(Rejection(500, "internal server error", "server_error"))


def _vocab_size(engine: LLMEngine) -> int | None:
    size = getattr(engine.tokenizer, "get_vocab_size", None)
    return size() if callable(size) else None


def create_app(engine: LLMEngine, config: ServerConfig | None = None) -> web.Application:
    """The aiohttp application serving ``engine``; the engine thread starts and stops with the
    app."""
    config = ServerConfig() if config is None else config
    if not isinstance(config, ServerConfig):
        raise TypeError(f"config must be a ServerConfig, got {type(config).__name__}")
    gate = IngressGate(
        config.api_keys, config.tenant_limits, config.per_tenant_limits, config.max_body_bytes
    )
    metrics = ServerMetrics(config.model_name)
    bridge = EngineBridge(
        engine,
        config.max_waiting,
        config.queue_timeout_s,
        config.stream_buffer_chunks,
        config.backpressure_timeout_s,
        metrics,
    )
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[openai_errors])
    _log.info("serving %s; %s", config.model_name, engine.kv_pool.describe())
    app[STATE] = _State(
        engine,
        config,
        gate,
        bridge,
        metrics,
        _vocab_size(engine),
        engine.allocator.num_blocks * engine.config.block_size,
        LogprobFormatter(engine.tokenizer),
        SharedCompiler(
            engine.tokenizer,
            engine.runner.model.config.vocab_size,
            engine.runner.model.config.eos_token_id,
        ),
    )

    async def start_engine(app: web.Application) -> None:
        bridge.start(asyncio.get_running_loop())

    async def stop_engine(app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, bridge.stop)

    app.on_startup.append(start_engine)
    app.on_shutdown.append(stop_engine)
    app.router.add_post("/v1/completions", _text)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model}", _model)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    add_utility_routes(app, STATE)
    return app


class BackgroundServer:
    """Serve ``engine`` over HTTP from a background thread with its own event loop (tests,
    notebooks).

    ``port=0`` picks a free port; :attr:`url` is then the base URL ending in ``/v1``. Use as a
    context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        engine: LLMEngine,
        config: ServerConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.app = create_app(engine, config)
        self.engine = engine
        self.host = host
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(self.app, handler_cancellation=True, shutdown_timeout=5.0)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="servelab-http", daemon=True
        )
        self._thread.start()
        try:
            self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(
                timeout=30
            )
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
    def config(self) -> ServerConfig:
        return self.app[STATE].config

    @property
    def bridge(self) -> EngineBridge:
        return self.app[STATE].bridge

    @property
    def gate(self) -> IngressGate:
        return self.app[STATE].gate

    def call(self, fn: Callable[[LLMEngine], Any], timeout_s: float = 30.0) -> Any:
        """Run ``fn(engine)`` on the engine thread between steps (safe inspection); blocks for the
        result."""
        return asyncio.run_coroutine_threadsafe(self.bridge.call(fn), self._loop).result(
            timeout=timeout_s
        )

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
