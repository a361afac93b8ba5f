"""Chat templates: turning a list of chat messages into the one prompt string a model was trained
on.

A Hugging Face model folder ships its template as Jinja source, in ``chat_template.jinja`` or under
the ``chat_template`` key of ``tokenizer_config.json`` (a string, or a list of named templates of
which ``"default"`` is the one used). It is rendered the way ``transformers`` renders it: a
sandboxed Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, the variables ``messages``
and ``add_generation_prompt``, the tokenizer's special tokens (``bos_token``, ``eos_token``, ...), a
``raise_exception`` function and ``strftime_now`` (Llama 3's templates print today's date).

The token ids of a chat are :func:`chat_token_ids`: the rendered text encoded *without* the
tokenizer's own additions (a template that writes ``{{ bos_token }}`` must not get a second BOS),
with the special tokens in the text parsed as specials; exactly ``transformers``'
``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)``.

System boundary: files of a model folder and a list of ``{"role": str, "content": str}`` dicts in,
one ``str`` out (tokenising it is the engine's business). Needs the ``jinja2`` package, only when a
template is rendered.
"""

from __future__ import annotations

import json
from datetime import datetime
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ChatTemplate", "apply_chat_template", "chat_token_ids", "load_chat_template"]

TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template: its Jinja ``source`` and the special-token strings it may refer
    to."""

    source: str
    special_tokens: dict[str, str] = field(default_factory=dict)

    def apply(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt for ``messages``; see :func:`apply_chat_template`."""
        return apply_chat_template(messages, self, add_generation_prompt)


def load_chat_template(directory: str | Path) -> ChatTemplate | None:
    """The chat template of a model folder, or None when it has none (a base model, the course
    model)."""
    directory = Path(directory)
    config_file = directory / TOKENIZER_CONFIG_FILE
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if (directory / TEMPLATE_FILE).is_file():
        source = (directory / TEMPLATE_FILE).read_text()
    else:
        source = _named_template(config.get("chat_template"), config_file)
    if source is None:
        return None
    from jinja2 import TemplateSyntaxError

    try:
        _compile(source)
    except TemplateSyntaxError as exc:
        raise ValueError(f"{directory}: the chat template is not valid Jinja: {exc}") from None
    return ChatTemplate(source, _special_tokens(config))


def _named_template(entry: object, where: Path) -> str | None:
    """``chat_template`` of ``tokenizer_config.json``: a string, or ``[{"name", "template"},
    ...]``."""
    if entry is None or isinstance(entry, str):
        return entry
    if isinstance(entry, list):
        named = {t.get("name"): t.get("template") for t in entry if isinstance(t, dict)}
        if "default" in named:
            return named["default"]
    raise ValueError(f"{where}: chat_template must be a string or a list with a 'default' entry")


def _special_tokens(config: dict) -> dict[str, str]:
    """``bos_token``, ``eos_token``, ... as strings (a config may store ``{"content": ...}``
    dicts)."""
    tokens = {}
    for key, value in config.items():
        if key.endswith("_token") and isinstance(value, dict):
            value = value.get("content")
        if key.endswith("_token") and isinstance(value, str):
            tokens[key] = value
    return tokens


def apply_chat_template(
    messages: list[dict], template: ChatTemplate, add_generation_prompt: bool = True
) -> str:
    """Render ``messages`` (each ``{"role": str, "content": str}``) with ``template``; with
    ``add_generation_prompt`` the text ends where the assistant's reply begins.

    Raises:
        ValueError: ``messages`` is not a non-empty list of such dicts, or the template itself
            raised (``raise_exception``, e.g. roles out of order).
    """
    if not isinstance(template, ChatTemplate):
        raise TypeError(f"template must be a ChatTemplate, got {type(template).__name__}")
    _check_messages(messages)
    try:
        return _compile(template.source).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            **template.special_tokens,
        )
    except _TemplateError as exc:
        raise ValueError(f"the chat template rejected the messages: {exc}") from None


def chat_token_ids(template: ChatTemplate, tokenizer, messages: list[dict],
                   add_generation_prompt: bool = True) -> list[int]:
    """The prompt ids of ``messages``: the rendered text encoded by the ``tokenizers.Tokenizer``
    with ``add_special_tokens=False`` (the template already wrote any BOS); specials in the text
    stay whole."""
    return tokenizer.encode(apply_chat_template(messages, template, add_generation_prompt),
                            add_special_tokens=False).ids


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': str, 'content': str} dicts")
    for i, message in enumerate(messages):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise ValueError(
                f"messages[{i}] must be a dict with str 'role' and 'content', got {message!r}"
            )


class _TemplateError(Exception):
    """What ``raise_exception`` inside a template raises."""


def _raise_exception(message: str) -> None:
    raise _TemplateError(message)


def _compile(source: str):
    """A template compiled in a sandboxed environment configured like ``transformers``'."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.policies["json.dumps_kwargs"] = {"ensure_ascii": False}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
