"""The request side of the OpenAI API: a bounded JSON body, validated fields, the chat template.

Everything here runs before tokenization and refuses a client's mistake with a 400
:class:`Rejection` that names the field (OpenAI's ``param``): the body's nesting depth is bounded
*before* ``json.loads`` (a deeply nested body would otherwise exhaust the parser's recursion),
``NaN``/``Infinity`` literals are not JSON, and every string the server uses must be encodable
Unicode (an unpaired surrogate such as ``"\\ud83d"`` is valid JSON but not text).

Accepted ``prompt`` shapes (as OpenAI and vLLM): a string, a list of strings, a list of token ids,
or a list of lists of token ids; each prompt is one engine request, and with ``n`` samples each,
choice ``index = prompt_i * n + j``. Chat ``content`` is a string or a list of ``{"type": "text",
"text": ...}`` parts. Structured outputs: ``response_format`` (``json_object``, ``json_schema``) or
vLLM's ``guided_json``, ``guided_choice`` and ``guided_regex`` (:mod:`servelab.sampling.grammar`).
Logprobs (``logprobs``/``top_logprobs``/``echo``) are the raw model's (see
:class:`~servelab.sampling.SamplingParams`). ``logit_bias`` maps token ids (JSON object keys, so
strings) to a bias in [-100, 100] added to the logits before sampling. A ``temperature`` below 1e-5
samples greedily (vLLM's rule; dividing the logits by a subnormal temperature would overflow them).
``temperature``, ``top_p``, ``top_k``, ``min_p`` and ``repetition_penalty`` left out of a body take
the served checkpoint's ``generation_config.json`` values when it has them (vLLM's
``--generation-config auto``), else the course defaults.

System boundary: the decoded JSON body of one request; no engine state.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab.sampling.grammar import GrammarSpec
from servelab.sampling import SamplingParams
from servelab.server.config import ServerConfig
from servelab.server.gate import Rejection

if TYPE_CHECKING:
    from servelab.model.chat_template import ChatTemplate

__all__ = [
    "ParsedRequest",
    "parse_json",
    "json_depth",
    "parse_request",
    "render_chat",
    "chat_prompt",
    "MAX_JSON_DEPTH",
]

MAX_JSON_DEPTH = 32  # nested objects/arrays a body may have; OpenAI's own bodies need 4
CHAT_END_OF_TURN = "\n\n"
MAX_STOP_STRINGS = 4
MAX_PROMPTS = 32
# a temperature under this samples greedily (vLLM's rule): 1/T would overflow the logits
GREEDY_BELOW = 1e-5
CHAT_ROLES = ("system", "developer", "user", "assistant")
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for the legacy completions ``logprobs``
MAX_CHAT_TOP_LOGPROBS = 20  # OpenAI's limit for chat ``top_logprobs``
UNSUPPORTED = ("suffix", "functions", "best_of")
GRAMMAR_FIELDS = ("response_format", "guided_json", "guided_choice", "guided_regex")
NO_TOOLS = ("tools", "tool_choice", "function_call")


@dataclass(frozen=True)
class ParsedRequest:
    """A validated request body. ``prompts`` are texts or token-id tuples (one engine request each);
    ``max_tokens_given`` is False when the client left the length to the server."""

    prompts: tuple[str | tuple[int, ...], ...]
    params: SamplingParams
    max_tokens_given: bool
    stream: bool
    include_usage: bool
    deadline_s: float
    logprobs: int | None = None  # alternatives per token when logprobs were asked for, else None
    echo: bool = False  # completions: the prompt (and its logprobs) goes before the generated text
    # echo with max_tokens 0: the prompt is scored, the sampled token not returned
    score_only: bool = False
    grammar: GrammarSpec | None = None  # structured output: what the text must match
    grammar_param: str | None = None  # the body field that asked for it


def bad(message: str, param: str | None = None, code: str | None = None) -> Rejection:
    """A 400 ``invalid_request_error`` naming ``param``."""
    return Rejection(400, message, "invalid_request_error", param=param, code=code)


# ---------------------------------------------------------------------------------------- the body


def json_depth(raw: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """Deepest nesting of ``[``/``{`` outside string literals in ``raw``; stops counting past
    ``limit``.

    Works on bytes: in UTF-8 the bytes of ``"``, ``\\`` and brackets never occur inside a multi-byte
    character, so no decoding is needed.
    """
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> object:
    """Decode a request body; a 400 for too deep a nesting, invalid UTF-8, invalid JSON or
    NaN/Infinity."""
    if json_depth(raw, max_depth) > max_depth:
        raise bad(
            f"the request body nests objects/arrays deeper than {max_depth} levels", code="too_deep"
        )
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise bad("the request body is not valid JSON") from None


def check_text(value: str, param: str) -> str:
    """``value`` if it is encodable Unicode; a 400 naming ``param`` for an unpaired surrogate."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad(f"{param} is not valid Unicode text (unpaired surrogate {value[exc.start]!r} at "
                  f"character {exc.start})", param) from None
    return value


# ---------------------------------------------------------------------------------------- fields


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if not _is_number(value) or not low <= value <= high:
        raise bad(f"{name} must be a number in [{low:g}, {high:g}], got {_show(value)}", name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad(f"{name} must be an integer in [{low}, {high}], got {_show(value)}", name)
    return value


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"{name} must be true or false, got {_show(value)}", name)
    return value


def _show(value: object) -> str:
    """A short, always-encodable rendering of a client's value for an error message."""
    text = ascii(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _token_ids(value: list, param: str, vocab_size: int | None) -> tuple[int, ...]:
    if not value or not all(type(t) is int and t >= 0 for t in value):
        raise bad(f"{param} must be a non-empty list of token ids (integers >= 0)", param)
    if vocab_size is not None and max(value) >= vocab_size:
        raise bad(
            f"{param} names token id {max(value)}, outside the vocabulary [0, {vocab_size - 1}]",
            param,
        )
    return tuple(value)


def parse_prompts(value: object, vocab_size: int | None) -> tuple[str | tuple[int, ...], ...]:
    """``prompt`` as a tuple of prompts: a string, strings, token ids, or lists of token ids."""
    shapes = (
        "prompt must be a non-empty string, a list of strings, a list of token ids or a list "
        "of such lists"
    )
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(type(t) is int for t in value):
        value = [value]
    if not isinstance(value, list) or not 0 < len(value) <= MAX_PROMPTS:
        raise bad(f"{shapes} (at most {MAX_PROMPTS} prompts)", "prompt")
    prompts: list[str | tuple[int, ...]] = []
    for i, item in enumerate(value):
        param = "prompt" if len(value) == 1 else f"prompt[{i}]"
        if isinstance(item, str) and item and isinstance(value[0], str):
            prompts.append(check_text(item, param))
        elif isinstance(item, list) and isinstance(value[0], list):
            prompts.append(_token_ids(item, param, vocab_size))
        else:
            raise bad(f"{shapes}, not a mix of them", param)
    return tuple(prompts)


def _content(content: object, param: str) -> str:
    """A chat message's text: a string, or a list of ``{"type": "text", "text": str}`` parts."""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise bad(f"{param} must be a string or a list of text parts", param)
    return check_text(content, param)


def chat_turns(messages: object) -> list[tuple[str, str | None, str]]:
    """``messages`` checked field by field: one ``(role, name or None, content text)`` per message;
    a 400 names the first bad field."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad(f"messages[{i}] must be an object with role and content", f"messages[{i}]")
        role, name = message.get("role"), message.get("name")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise bad(
                f"messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got {_show(role)}",
                f"messages[{i}].role",
            )
        content = _content(message.get("content"), f"messages[{i}].content")
        if name is not None and (not isinstance(name, str) or not name.strip() or "\n" in name):
            raise bad(
                f"messages[{i}].name must be a one-line non-empty string", f"messages[{i}].name"
            )
        if name is not None:
            check_text(name, f"messages[{i}].name")
        turns.append((role, name, content))
    return turns


def render_chat(messages: object) -> str:
    """The course model's chat template: ``"NAME:\\ncontent\\n\\n"`` per message, then
    ``"ASSISTANT:\\n"``."""
    return (
        "".join(
            f"{name or role.upper()}:\n{content}\n\n"
            for role, name, content in chat_turns(messages)
        )
        + "ASSISTANT:\n"
    )


def _stop_strings(body: dict, course_chat: bool) -> tuple[str, ...]:
    """``stop`` checked; for the course chat format the end of a turn stops by default (a model's
    own chat template ends a turn with its end-of-sequence token instead)."""
    stop = body.get("stop")
    if stop is None:
        return (CHAT_END_OF_TURN,) if course_chat else ()
    stops = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stops, list) or not 0 < len(stops) <= MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stops)):
        raise bad(
            f"stop must be a non-empty string or a list of 1 to {MAX_STOP_STRINGS} such strings",
            "stop",
        )
    return tuple(check_text(s, "stop") for s in stops)


def parse_logit_bias(value: object, vocab_size: int | None) -> dict[int, float]:
    """OpenAI's ``logit_bias``: ``{"token id": bias}`` with bias in [-100, 100]."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad(
            "logit_bias must be an object mapping token ids to a bias in [-100, 100]", "logit_bias"
        )
    bias = {}
    for key, offset in value.items():
        token = (
            int(key)
            if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 10
            else -1
        )
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            raise bad(
                f"logit_bias keys must be token ids in [0, {(vocab_size or 2**31) - 1}], "
                f"got {_show(key)}",
                "logit_bias",
            )
        if not _is_number(offset) or not -100 <= offset <= 100:
            raise bad(
                f"logit_bias[{key}] must be a number in [-100, 100], got {_show(offset)}",
                "logit_bias",
            )
        bias[token] = float(offset)
    return bias


def _unsupported(body: dict) -> None:
    for name in NO_TOOLS:
        if body.get(name) not in (None, "none", []):
            raise bad(
                f"{name} is not supported by this server: the course model was not trained "
                f"to call tools, "
                "so a tool call it produced would be noise",
                name,
            )
    for name in UNSUPPORTED:
        value = body.get(name)
        if value is None or value is False or (type(value) is int and value == 0):
            continue
        if name == "best_of" and type(value) is int and value == body.get("n", 1):
            continue
        raise bad(f"{name} is not supported by this server", name)


def _top_k(body: dict, default: int | None) -> int | None:
    top_k = body.get("top_k")
    if type(top_k) is int and top_k in (-1, 0):
        return None  # vLLM / SGLang spell "no top-k" as -1 (or 0)
    return _integer(body, "top_k", default, 1, 1 << 20)


def _temperature(body: dict, default: float) -> float:
    temperature = _number(body, "temperature", default, 0.0, 2.0)
    return 0.0 if temperature < GREEDY_BELOW else temperature


def _json_schema(value: object, param: str) -> GrammarSpec:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise bad(
                f"{param} must be a JSON schema (an object), got text that is not JSON", param
            ) from None
    if not isinstance(value, (dict, bool)):
        raise bad(f"{param} must be a JSON schema (an object)", param)
    return GrammarSpec("json_schema", json.dumps(value))


def _response_format(value: object) -> GrammarSpec | None:
    """OpenAI's ``response_format``: ``text`` (no grammar), ``json_object`` or ``json_schema``."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_schema", '{"type": "object"}')
    if kind == "json_schema":
        inner = value.get("json_schema")
        if not isinstance(inner, dict) or "schema" not in inner:
            raise bad(
                'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}',
                "response_format",
            )
        return _json_schema(inner["schema"], "response_format")
    raise bad(
        'response_format must be {"type": "text"}, {"type": "json_object"} or {"type": '
        '"json_schema", '
        f'"json_schema": {{...}}}}, got {_show(value)}',
        "response_format",
    )


def _grammar(body: dict) -> tuple[GrammarSpec | None, str | None]:
    """The structured-output request: OpenAI's ``response_format`` or vLLM's ``guided_json``,
    ``guided_choice`` (a list of strings) or ``guided_regex``, at most one of them."""
    given = [name for name in GRAMMAR_FIELDS if body.get(name) is not None]
    if len(given) > 1:
        raise bad(
            f"give at most one of {', '.join(GRAMMAR_FIELDS)}; got {', '.join(given)}", given[1]
        )
    if not given:
        return None, None
    name, value = given[0], body[given[0]]
    if name == "response_format":
        spec = _response_format(value)
    elif name == "guided_json":
        spec = _json_schema(value, name)
    elif name == "guided_choice":
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(c, str) and c for c in value)
        ):
            raise bad("guided_choice must be a non-empty list of non-empty strings", name)
        spec = GrammarSpec("choice", tuple(check_text(c, name) for c in value))
    else:
        if not isinstance(value, str) or not value:
            raise bad("guided_regex must be a non-empty string (a regular expression)", name)
        spec = GrammarSpec("regex", check_text(value, name))
    return spec, name


def _logprobs(body: dict, chat: bool) -> tuple[int | None, bool]:
    """``(alternatives per token or None, echo)``: completions' ``logprobs: k`` (0..5) and ``echo``;
    chat's ``logprobs: true`` with ``top_logprobs: k`` (0..20)."""
    if not chat:
        return _integer(body, "logprobs", None, 0, MAX_COMPLETION_LOGPROBS), _flag(
            body, "echo", False
        )
    if body.get("echo") not in (None, False):
        raise bad("echo is a completions field; chat completions do not echo the prompt", "echo")
    top = _integer(body, "top_logprobs", None, 0, MAX_CHAT_TOP_LOGPROBS)
    if not _flag(body, "logprobs", False):
        if top is not None:
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
        return None, False
    return (top or 0), False


def _sampling_params(body: dict, chat: bool, config: ServerConfig, vocab_size: int | None,
                     course_chat: bool, logprobs: int | None, echo: bool,
                     defaults: Mapping[str, float | int]) -> SamplingParams:
    """The body's sampling fields as :class:`SamplingParams`, range-checked with OpenAI's limits; a
    field the body leaves out (or sends as null) takes the checkpoint's value from ``defaults``
    (``generation_config.json``'s, :mod:`servelab.model.generation_config`), else the course
    default.

    ``max_tokens: 0`` is allowed with ``echo`` (score the prompt): the engine still samples one
    token, from the logits the prompt's prefill computes anyway, and the answer leaves it out."""
    tokens_field = (
        "max_completion_tokens"
        if chat and body.get("max_completion_tokens") is not None
        else "max_tokens"
    )
    max_tokens = _integer(body, tokens_field, config.default_max_tokens, 0 if echo else 1, 1 << 20)
    try:
        return SamplingParams(
            temperature=_temperature(body, defaults.get("temperature", 1.0)),
            top_k=_top_k(body, defaults.get("top_k")),
            top_p=_number(body, "top_p", defaults.get("top_p", 1.0), 0.0, 1.0),
            min_p=_number(body, "min_p", defaults.get("min_p", 0.0), 0.0, 1.0),
            presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            repetition_penalty=_number(
                body, "repetition_penalty", defaults.get("repetition_penalty", 1.0), 0.01, 10.0
            ),
            logit_bias=parse_logit_bias(body.get("logit_bias"), vocab_size),
            max_tokens=max(1, max_tokens),
            stop=_stop_strings(body, course_chat),
            ignore_eos=_flag(body, "ignore_eos", False),
            seed=_integer(body, "seed", None, 0, (1 << 63) - 1),
            n=_integer(body, "n", 1, 1, config.max_n),
            logprobs=logprobs,
            prompt_logprobs=logprobs if echo else None,
        )
    except (ValueError, TypeError) as exc:  # SamplingParams' own checks name the field first
        raise bad(str(exc), str(exc).split(" ")[0]) from exc


def _model(body: dict, config: ServerConfig) -> None:
    model = body.get("model")
    if model is None:
        raise bad("model is required", "model")
    if model != config.model_name:
        raise Rejection(
            404,
            f"model {_show(model)} does not exist; this server serves {config.model_name!r}",
            "not_found_error",
            param="model",
            code="model_not_found",
        )


def chat_prompt(messages: object, template: ChatTemplate | None) -> str:
    """The prompt for chat ``messages``: the model's own chat template when its checkpoint has one,
    else the course format (:func:`render_chat`). Every field is checked either way."""
    if template is None:
        return render_chat(messages)
    turns = [{"role": role, "content": content} for role, _, content in chat_turns(messages)]
    try:
        return template.apply(turns)
    except ValueError as exc:
        raise bad(
            f"messages cannot be rendered with the model's chat template: {exc}", "messages"
        ) from exc


def parse_request(body: object, chat: bool, config: ServerConfig, vocab_size: int | None = None,
                  chat_template: ChatTemplate | None = None,
                  sampling_defaults: Mapping[str, float | int] | None = None) -> ParsedRequest:
    """Validate a completions (``chat`` False) or chat-completions body; raises a 4xx
    :class:`Rejection`.

    ``vocab_size`` bounds the token ids a client may name (in ``prompt`` and ``logit_bias``);
    ``chat_template`` is the served checkpoint's own template, if it has one; ``sampling_defaults``
    are its ``generation_config.json`` settings
    (:attr:`servelab.engine.LLMEngine.default_sampling`), the values of the sampling fields a body
    leaves out.
    """
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    _model(body, config)
    _unsupported(body)
    prompts = ((chat_prompt(body.get("messages"), chat_template),) if chat
               else parse_prompts(body.get("prompt"), vocab_size))
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise bad("stream_options must be an object", "stream_options")
    given = (
        body.get(
            "max_completion_tokens"
            if chat and body.get("max_completion_tokens") is not None
            else "max_tokens"
        )
        is not None
    )
    course_chat = chat and chat_template is None
    logprobs, echo = _logprobs(body, chat)
    params = _sampling_params(
        body, chat, config, vocab_size, course_chat, logprobs, echo, sampling_defaults or {}
    )
    grammar, grammar_param = _grammar(body)
    if grammar is not None and params.ignore_eos:
        raise bad(
            f"ignore_eos cannot be combined with {grammar_param}: once the grammar is "
            f"complete only the "
            "end-of-sequence token is allowed",
            "ignore_eos",
        )
    return ParsedRequest(
        prompts,
        params,
        given,
        _flag(body, "stream", False),
        _flag(stream_options, "include_usage", False),
        _number(body, "deadline_s", config.request_timeout_s, 1e-3, config.request_timeout_s),
        logprobs,
        echo,
        echo and body.get("max_tokens") == 0,
        grammar,
        grammar_param,
    )
