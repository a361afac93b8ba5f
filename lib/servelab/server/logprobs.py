"""Logprobs in OpenAI's two response formats, from the engine's :class:`TokenLogprob` records.

What is reported: the raw model's ``log_softmax`` (natural log), before temperature, penalties, bias
or any other processor (vLLM's default ``logprobs_mode="raw_logprobs"``), so the numbers do not
depend on how the token was chosen. The engine computes them from the logits of the step that
produced the token: no second forward pass. Prompt logprobs (``echo`` with ``logprobs``) need the
logits of every prompt position, so such a request never reads the prefix cache (the engine gives it
a namespace of its own) and ``usage.prompt_tokens_details.cached_tokens`` is 0 for it.

* Completions (legacy): ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, one entry
  per token; with ``echo`` the prompt's tokens come first, the first of them with ``null`` logprob
  and ``null`` top_logprobs (nothing predicts it). ``top_logprobs[i]`` maps token text to logprob.
  ``text_offset[i]`` is where token ``i``'s text starts in the choice's text.
* Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}]}], "refusal": null}``.

A token's text is ``tokenizer.decode([id])``: a byte-level token that holds part of a UTF-8
character decodes to U+FFFD on its own, which ``bytes`` (the token's own UTF-8 bytes of that text)
does not repair. An end-of-sequence token is listed (lm-evaluation-harness reads the generated
token's entry whatever it is) with its decoded text, which is usually empty.

System boundary: records in, JSON-ready dicts out; no engine state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from servelab.engine.logprobs import TokenLogprob

__all__ = ["LOGPROB_FLOOR", "LogprobFormatter", "CompletionLogprobs"]

LOGPROB_FLOOR = -9999.0  # JSON has no -Infinity; vLLM reports an impossible token at this value


def _value(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


class LogprobFormatter:
    """Token texts (cached per id) and the two formats' entries."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def text(self, token: int) -> str:
        """The token's text on its own."""
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self._tokenizer.decode([token])
        return text

    def top_dict(self, record: TokenLogprob) -> dict[str, float]:
        """The completions format's ``{token text: logprob}`` of the alternatives (the first wins a
        text clash)."""
        top: dict[str, float] = {}
        for token, logprob in record.top:
            top.setdefault(self.text(token), _value(logprob))
        return top

    def chat_entry(self, record: TokenLogprob) -> dict:
        """One entry of the chat format's ``content`` list."""
        def item(token: int, logprob: float) -> dict:
            text = self.text(token)
            return {"token": text, "logprob": _value(logprob), "bytes": list(text.encode())}

        return item(record.token, record.logprob) | {
            "top_logprobs": [item(t, lp) for t, lp in record.top]
        }


@dataclass
class CompletionLogprobs:
    """The legacy format built up chunk by chunk; ``offset`` is where the next token's text
    starts."""

    offset: int = 0
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def add_first(self, formatter: LogprobFormatter, token: int) -> None:
        """The prompt's first token: text, no logprob."""
        self._add(formatter.text(token), None, None)

    def add(self, formatter: LogprobFormatter, records: Sequence[TokenLogprob]) -> None:
        for record in records:
            self._add(
                formatter.text(record.token), _value(record.logprob), formatter.top_dict(record)
            )

    def _add(self, text: str, logprob: float | None, top: dict | None) -> None:
        self.tokens.append(text)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(self.offset)
        self.offset += len(text)

    def body(self, since: int = 0) -> dict:
        """The entries from index ``since`` on, as OpenAI's ``logprobs`` object."""
        return {"tokens": self.tokens[since:], "token_logprobs": self.token_logprobs[since:],
                "top_logprobs": self.top_logprobs[since:], "text_offset": self.text_offset[since:]}
