"""The response side of the OpenAI API: errors, choices, usage, JSON bodies and server-sent events.

One HTTP request becomes one engine request per prompt; each engine request with ``n`` samples (the
engine prefills the prompt once and forks it) feeds ``n`` choices, so choice ``index = prompt_i *
n + j``.

Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with ``type`` one of
:data:`~servelab.server.gate.ERROR_TYPES` and ``code`` a string or null. An error after the response
headers went out is sent as one ``data: {"error": ...}`` event, then ``data: [DONE]``.

Streaming format: one ``data: {json}`` event per engine step and choice that produced text; the last
event of each choice carries its ``finish_reason``; with ``stream_options.include_usage`` every
chunk carries ``"usage": null`` and one more event with empty ``choices`` carries the usage (OpenAI
semantics); then ``data: [DONE]``.

Logprobs and ``echo``: see :mod:`servelab.server.logprobs`. With ``echo`` the prompt's text (and,
with ``logprobs``, its tokens' entries) opens each choice, in the first streamed chunk of that
choice; with ``echo`` and ``max_tokens: 0`` (:attr:`ParsedRequest.score_only`) the token the engine
sampled is left out, the choice ends with ``"length"`` and ``completion_tokens`` is 0.

Usage: ``prompt_tokens`` counts each prompt once; ``completion_tokens`` counts tokens the engine
*generated* (what was computed and is billed), summed over choices;
``prompt_tokens_details.cached_tokens`` the prefix-cache hits; the extension
``servelab_emitted_tokens`` counts the tokens whose text reached the client (EOS and a stop-string's
last token are generated but not emitted).

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
from servelab.engine.logprobs import TokenLogprob
from servelab.server.streams import (
    BridgeError,
    EngineFailure,
    InvalidRequest,
    QueueTimeout,
    RequestStream,
    SlowClient,
)
from servelab.server.gate import Rejection
from servelab.server.logprobs import CompletionLogprobs, LogprobFormatter

__all__ = ["error_response", "error_body", "rejection_for", "Exchange", "Move", "OPENAI_FINISH"]

OPENAI_FINISH = {"stop": "stop", "eos": "stop", "length": "length"}


def error_body(rejection: Rejection) -> dict:
    """OpenAI's error object for ``rejection``."""
    return {
        "error": {
            "message": rejection.message,
            "type": rejection.error_type,
            "param": rejection.param,
            "code": rejection.code,
        }
    }


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
            return Rejection(
                504,
                "the request's deadline passed before it finished",
                "server_error",
                param="deadline_s",
                code="timeout",
            )
        return Rejection(
            500,
            f"the engine ended the request: {problem.finish_reason}",
            "server_error",
            code="engine_failure",
        )
    if isinstance(problem, InvalidRequest):
        return Rejection(400, str(problem), "invalid_request_error")
    if isinstance(problem, QueueTimeout):
        return Rejection(
            503,
            str(problem),
            "server_error",
            retry_after_s=problem.retry_after_s,
            code="overloaded",
        )
    if isinstance(problem, SlowClient):
        return Rejection(503, str(problem), "server_error", code="slow_client")
    if isinstance(problem, EngineFailure):
        return Rejection(500, str(problem), "server_error", code="engine_failure")
    return Rejection(503, str(problem), "server_error")


def sse(payload: dict | str) -> bytes:
    """One server-sent event: ``data: <json or literal>`` and the blank line that ends it."""
    return (
        b"data: "
        + (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        + b"\n\n"
    )


@dataclass
class _Choice:
    """One choice of a response and what arrived for it so far."""

    index: int
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None  # OpenAI's, once this choice ended normally
    started: bool = False  # its first piece (with the echoed prompt, if any) went out
    # completions' logprobs so far
    legacy: CompletionLogprobs = field(default_factory=CompletionLogprobs)
    chat_logprobs: list[dict] = field(default_factory=list)  # chat's logprobs entries so far


@dataclass
class Move:
    """What one engine output added to one choice: text, logprobs entries from index ``since``, an
    end."""

    choice: _Choice
    text: str
    finish_reason: str | None
    since: int


@dataclass
class _Prompt:
    """One engine request (one prompt, ``n`` samples) and its choices."""

    stream: RequestStream
    prompt_ids: list[int]
    choices: list[_Choice]
    echo_text: str | None = None  # the prompt's text when the request echoes it
    score_only: bool = False
    last: RequestOutput | None = None
    problem: BridgeError | RequestOutput | None = None
    prompt_logprobs: tuple[TokenLogprob, ...] = ()

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def done(self) -> bool:
        return self.problem is not None or (self.last is not None and self.last.finished)

    def record(self, item: BridgeError | RequestOutput, exchange: "Exchange") -> list[Move]:
        """Apply one engine output; returns a :class:`Move` per choice that moved."""
        if isinstance(item, BridgeError):
            self.problem = item
            return []
        self.last = item
        if item.finished and item.finish_reason not in OPENAI_FINISH:
            self.problem = item
            return []
        if item.prompt_logprobs is not None:
            self.prompt_logprobs = item.prompt_logprobs
        parts = (
            [(s.index, s.delta, s.finished, s.finish_reason, s.logprobs) for s in item.samples]
            if item.samples
            else [(0, item.delta, item.finished, item.finish_reason, item.logprobs)]
        )
        moved = []
        for j, delta, finished, reason, records in parts:
            choice = self.choices[j]
            if self.score_only:
                delta, records = "", ()
            ending = finished and choice.finish_reason is None
            if ending:
                choice.finish_reason = "length" if self.score_only else OPENAI_FINISH[reason]
            if not (delta or records or ending):
                continue
            since = len(choice.chat_logprobs if exchange.chat else choice.legacy.tokens)
            if not choice.started:
                choice.started = True
                delta = self._open(choice, exchange) + delta
            exchange.add_logprobs(choice, records)
            choice.text.append(delta)
            moved.append(Move(choice, delta, choice.finish_reason if ending else None, since))
        return moved

    def _open(self, choice: _Choice, exchange: "Exchange") -> str:
        """The echoed prompt that opens a choice: its text, and its tokens' logprobs entries."""
        if self.echo_text is None:
            return ""
        if exchange.logprobs is not None:
            choice.legacy.add_first(exchange.formatter, self.prompt_ids[0])
            choice.legacy.add(exchange.formatter, self.prompt_logprobs)
        choice.legacy.offset = len(self.echo_text)
        return self.echo_text


class Exchange:
    """One HTTP request's conversation with the engine: its prompts, choices, ids and envelopes.

    ``logprobs``: alternatives per token when the request asked for logprobs, else None;
    ``echo_texts``: each prompt's text when the prompt is echoed (completions), else None.
    """

    def __init__(
        self,
        streams: list[RequestStream],
        prompt_ids: list[list[int]],
        n: int,
        chat: bool,
        model: str,
        include_usage: bool,
        formatter: LogprobFormatter | None = None,
        logprobs: int | None = None,
        echo_texts: list[str] | None = None,
        score_only: bool = False,
    ) -> None:
        echo_texts = echo_texts or [None] * len(streams)
        self.prompts = [_Prompt(s, ids, [_Choice(i * n + j) for j in range(n)], echo, score_only)
                        for i, (s, ids, echo) in enumerate(zip(streams, prompt_ids, echo_texts))]
        self.choices = [c for p in self.prompts for c in p.choices]
        self.chat = chat
        self.model = model
        self.include_usage = include_usage
        self.formatter = formatter
        self.logprobs = logprobs
        self.score_only = score_only
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def add_logprobs(self, choice: _Choice, records) -> None:
        """Append a choice's new tokens' logprobs (when asked for) in the response's format."""
        if self.logprobs is None:
            return
        if self.chat:
            choice.chat_logprobs += [self.formatter.chat_entry(r) for r in records]
        else:
            choice.legacy.add(self.formatter, records)

    def _logprobs_body(self, choice: _Choice, since: int = 0) -> dict | None:
        if self.logprobs is None:
            return None
        if self.chat:
            return {"content": choice.chat_logprobs[since:], "refusal": None}
        return choice.legacy.body(since)

    async def events(self):
        """Yield ``(prompt, moves)`` in arrival order across prompts until every prompt's request
        ends.

        One reader task per prompt hands items over through a one-slot queue, so an unread output
        stays in its bounded :class:`RequestStream` (and backpressure reaches the engine thread).
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
                moved = prompt.record(item, self)
                remaining -= prompt.done
                yield prompt, moved
        finally:
            for reader in readers:
                reader.cancel()

    def usage(self) -> dict:
        outputs = [p.last for p in self.prompts if p.last is not None]
        prompt_tokens = sum(p.prompt_tokens for p in self.prompts)
        generated = 0 if self.score_only else sum(o.usage.generated_tokens for o in outputs)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": generated,
            "total_tokens": prompt_tokens + generated,
            "prompt_tokens_details": {
                "cached_tokens": sum(o.usage.cached_prompt_tokens for o in outputs)
            },
            "servelab_emitted_tokens": 0
            if self.score_only
            else sum(o.usage.emitted_tokens for o in outputs),
        }

    def chunk(self, choices: list[dict], usage: dict | None = None) -> bytes:
        body = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = usage
        return sse(body)

    def role_chunk(self) -> bytes:
        """Chat streams open every choice with ``{"role": "assistant", "content": ""}``."""
        return self.chunk(
            [
                {
                    "index": c.index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                for c in self.choices
            ]
        )

    def stream_choice(self, move: Move) -> dict:
        logprobs = self._logprobs_body(move.choice, move.since)
        if self.chat:
            delta = {"content": move.text} if move.text else {}
            return {"index": move.choice.index, "delta": delta, "logprobs": logprobs,
                    "finish_reason": move.finish_reason}
        return {"index": move.choice.index, "text": move.text, "logprobs": logprobs,
                "finish_reason": move.finish_reason}

    def full_body(self) -> dict:
        choices = []
        for c in self.choices:
            text = "".join(c.text)
            if self.chat:
                choices.append(
                    {
                        "index": c.index,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": self._logprobs_body(c),
                        "finish_reason": c.finish_reason,
                    }
                )
            else:
                choices.append({"index": c.index, "text": text, "logprobs": self._logprobs_body(c),
                                "finish_reason": c.finish_reason})
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }
