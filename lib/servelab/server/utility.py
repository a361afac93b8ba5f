"""The server's utility endpoints, shaped like vLLM's: ``POST /tokenize``, ``POST /detokenize``,
``GET /version``.

* ``/tokenize``: ``{"prompt": str}`` or ``{"messages": [...]}`` (rendered with the chat template the
  chat endpoint uses, generation prompt included), optional ``"model"`` and ``"return_token_strs"``;
  answers ``{"count", "max_model_len", "tokens", "token_strs"}`` (``token_strs`` null unless asked
  for). The ids are exactly what a completions or chat request with the same text would send to the
  engine.
* ``/detokenize``: ``{"tokens": [ids]}`` -> ``{"prompt": text}``.
* ``/version``: ``{"version": servelab.__version__}``.

Tokenize and detokenize pass the ingress gate like any request (API key, rate limit) and refuse bad
input with a 400 naming the field. System boundary: one HTTP request, the engine's tokenizer; no
engine step.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

import servelab
from servelab.server.gate import Rejection
from servelab.server.protocol import _flag, _token_ids, bad, chat_prompt, check_text, parse_json
from servelab.server.responses import error_response

__all__ = ["add_utility_routes"]


def _check_model(body: dict, served: str) -> None:
    model = body.get("model")
    if model is not None and model != served:
        raise Rejection(
            404,
            f"model {ascii(model)[:60]} does not exist; this server serves {served!r}",
            "not_found_error",
            param="model",
            code="model_not_found",
        )


def _tokenize(state, body: object) -> dict:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    _check_model(body, state.config.model_name)
    if (body.get("prompt") is None) == (body.get("messages") is None):
        raise bad("give exactly one of prompt (a string) or messages (a chat)", "prompt")
    if body.get("messages") is not None:
        text = chat_prompt(body["messages"], state.engine.chat_template)
    elif isinstance(body["prompt"], str):
        text = check_text(body["prompt"], "prompt")
    else:
        raise bad("prompt must be a string", "prompt")
    # a chat rendered by the checkpoint's template already wrote its BOS: encoded as the chat path
    # does
    templated = body.get("messages") is not None and state.engine.chat_template is not None
    ids = state.engine.tokenizer.encode(text, add_special_tokens=not templated).ids
    strs = (
        [state.formatter.text(t) for t in ids] if _flag(body, "return_token_strs", False) else None
    )
    return {
        "count": len(ids),
        "max_model_len": state.engine.max_model_len,
        "tokens": ids,
        "token_strs": strs,
    }


def _detokenize(state, body: object) -> dict:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    _check_model(body, state.config.model_name)
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise bad("tokens must be a non-empty list of token ids", "tokens")
    return {
        "prompt": state.engine.tokenizer.decode(
            list(_token_ids(tokens, "tokens", state.vocab_size))
        )
    }


def add_utility_routes(app: web.Application, state_key: web.AppKey) -> None:
    """Register the three endpoints on ``app``, whose server state is ``app[state_key]``."""
    def handler(work: Callable[[object, object], dict]):
        async def handle(request: web.Request) -> web.Response:
            state = request.app[state_key]
            try:
                state.gate.admit(request.headers.get("Authorization"), request.content_length)
                raw = await request.read()
                return web.json_response(work(state, parse_json(raw)))
            except web.HTTPRequestEntityTooLarge:
                return error_response(state.gate.body_too_large())
            except Rejection as rejection:
                return error_response(rejection)
        return handle

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": servelab.__version__})

    app.router.add_post("/tokenize", handler(_tokenize))
    app.router.add_post("/detokenize", handler(_detokenize))
    app.router.add_get("/version", version)
