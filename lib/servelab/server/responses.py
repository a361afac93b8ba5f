"""The response side of the OpenAI API: errors, choices, usage, JSON bodies and server-sent events.

One HTTP request becomes one engine request per prompt; each engine request with ``n`` samples (the
engine prefills the prompt once and forks it) feeds ``n`` choices, so choice ``index = prompt_i * n + j``.

Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with ``type`` one of
:data:`~servelab.server.gate.ERROR_TYPES` and ``code`` a string or null. An error after the response
headers went out is sent as one ``data: {"error": ...}`` event, then ``data: [DONE]``.

Streaming format: one ``data: {json}`` event per engine step and choice that produced text; the last
event of each choice carries its ``finish_reason``; with ``stream_options.include_usage`` every chunk
carries ``"usage": null`` and one more event with empty ``choices`` carries the usage (OpenAI
semantics); then ``data: [DONE]``.

Usage: ``prompt_tokens`` counts each prompt once; ``completion_tokens`` counts tokens the engine
*generated* (what was computed and is billed), summed over choices; ``prompt_tokens_details.cached_tokens``
the prefix-cache hits; the extension ``servelab_emitted_tokens`` counts the tokens whose text reached the
client (EOS and a stop-string's last token are generated but not emitted).

System boundary: the handler's side of the bridge (event-loop thread).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from dataclasses import dataclass, field

from aiohttp import web

from servelab.engine import RequestOutput
from servelab.server.bridge import (BridgeError, EngineFailure, InvalidRequest, QueueTimeout, RequestStream,
                                    SlowClient)
from servelab.server.gate import Rejection

__all__ = ["error_response", "error_body", "rejection_for", "Exchange", "OPENAI_FINISH"]

OPENAI_FINISH = {"stop": "stop", "eos": "stop", "length": "length"}


def error_body(rejection: Rejection) -> dict:
    """OpenAI's error object for ``rejection``."""
    return {"error": {"message": rejection.message, "type": rejection.error_type, "param": rejection.param,
                      "code": rejection.code}}


def error_response(rejection: Rejection) -> web.Response:
    """The JSON error answer with the rejection's status (and Retry-After in whole seconds)."""
    headers = {"WWW-Authenticate": "Bearer"} if rejection.status == 401 else {}
    if rejection.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(rejection.retry_after_s)))
    return web.json_response(error_body(rejection), status=rejection.status, headers=headers)


def rejection_for(problem: BridgeError | RequestOutput) -> Rejection:
    """The HTTP answer for an engine request that did not finish normally."""
    if isinstance(problem, RequestOutput):
        if problem.finish_reason == "timed_out":
            return Rejection(504, "the request's deadline passed before it finished", "server_error",
                             param="deadline_s", code="timeout")
        return Rejection(500, f"the engine ended the request: {problem.finish_reason}", "server_error",
                         code="engine_failure")
    if isinstance(problem, InvalidRequest):
        return Rejection(400, str(problem), "invalid_request_error")
    if isinstance(problem, QueueTimeout):
        return Rejection(503, str(problem), "server_error", retry_after_s=problem.retry_after_s, code="overloaded")
    if isinstance(problem, SlowClient):
        return Rejection(503, str(problem), "server_error", code="slow_client")
    if isinstance(problem, EngineFailure):
        return Rejection(500, str(problem), "server_error", code="engine_failure")
    return Rejection(503, str(problem), "server_error")


def sse(payload: dict | str) -> bytes:
    """One server-sent event: ``data: <json or literal>`` and the blank line that ends it."""
    return b"data: " + (payload if isinstance(payload, str) else json.dumps(payload)).encode() + b"\n\n"


@dataclass
class _Choice:
    """One choice of a response and what arrived for it so far."""

    index: int
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None  # OpenAI's, once this choice ended normally


@dataclass
class _Prompt:
    """One engine request (one prompt, ``n`` samples) and its choices."""

    stream: RequestStream
    prompt_tokens: int
    choices: list[_Choice]
    last: RequestOutput | None = None
    problem: BridgeError | RequestOutput | None = None

    @property
    def done(self) -> bool:
        return self.problem is not None or (self.last is not None and self.last.finished)

    def record(self, item: BridgeError | RequestOutput) -> list[tuple[_Choice, str, str | None]]:
        """Apply one engine output; returns ``(choice, new text, finish_reason or None)`` per choice that moved."""
        if isinstance(item, BridgeError):
            self.problem = item
            return []
        self.last = item
        if item.finished and item.finish_reason not in OPENAI_FINISH:
            self.problem = item
            return []
        parts = ([(s.index, s.delta, s.finished, s.finish_reason) for s in item.samples] if item.samples
                 else [(0, item.delta, item.finished, item.finish_reason)])
        moved = []
        for j, delta, finished, reason in parts:
            choice = self.choices[j]
            ending = finished and choice.finish_reason is None
            if ending:
                choice.finish_reason = OPENAI_FINISH[reason]
            if delta or ending:
                choice.text.append(delta)
                moved.append((choice, delta, choice.finish_reason if ending else None))
        return moved


class Exchange:
    """One HTTP request's conversation with the engine: its prompts, choices, ids and envelopes."""

    def __init__(self, streams: list[RequestStream], prompt_tokens: list[int], n: int, chat: bool, model: str,
                 include_usage: bool) -> None:
        self.prompts = [_Prompt(s, p, [_Choice(i * n + j) for j in range(n)])
                        for i, (s, p) in enumerate(zip(streams, prompt_tokens))]
        self.choices = [c for p in self.prompts for c in p.choices]
        self.chat = chat
        self.model = model
        self.include_usage = include_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    async def events(self):
        """Yield ``(prompt, moved)`` in arrival order across prompts until every prompt's request ends.

        One reader task per prompt hands items over through a one-slot queue, so an unread output stays
        in its bounded :class:`RequestStream` (and backpressure reaches the engine thread).
        """
        handoff: asyncio.Queue = asyncio.Queue(maxsize=1)

        async def read(prompt: _Prompt) -> None:
            while True:
                try:
                    item = await prompt.stream.next()
                except BridgeError as exc:
                    await handoff.put((prompt, exc))
                    return
                await handoff.put((prompt, item))
                if item.finished:
                    return

        readers = [asyncio.create_task(read(p)) for p in self.prompts]
        try:
            remaining = len(self.prompts)
            while remaining:
                prompt, item = await handoff.get()
                moved = prompt.record(item)
                remaining -= prompt.done
                yield prompt, moved
        finally:
            for reader in readers:
                reader.cancel()

    def usage(self) -> dict:
        outputs = [p.last for p in self.prompts if p.last is not None]
        prompt_tokens = sum(p.prompt_tokens for p in self.prompts)
        generated = sum(o.usage.generated_tokens for o in outputs)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                "total_tokens": prompt_tokens + generated,
                "prompt_tokens_details": {"cached_tokens": sum(o.usage.cached_prompt_tokens for o in outputs)},
                "servelab_emitted_tokens": sum(o.usage.emitted_tokens for o in outputs)}

    def chunk(self, choices: list[dict], usage: dict | None = None) -> bytes:
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices}
        if self.include_usage:
            body["usage"] = usage
        return sse(body)

    def role_chunk(self) -> bytes:
        """Chat streams open every choice with ``{"role": "assistant", "content": ""}``."""
        return self.chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None} for c in self.choices])

    def stream_choice(self, index: int, text: str, finish_reason: str | None) -> dict:
        if self.chat:
            delta = {"content": text} if text else {}
            return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def full_body(self) -> dict:
        choices = []
        for c in self.choices:
            text = "".join(c.text)
            if self.chat:
                choices.append({"index": c.index, "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": c.finish_reason})
            else:
                choices.append({"index": c.index, "text": text, "logprobs": None, "finish_reason": c.finish_reason})
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": self.usage()}
