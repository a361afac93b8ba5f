"""Structured outputs with xgrammar: a grammar compiled once per request, matched token by token per
sample.

xgrammar (the grammar engine vLLM and SGLang use) compiles a JSON schema, a regular expression or an
EBNF grammar against the tokenizer's vocabulary; a :class:`xgrammar.GrammarMatcher` then says, at
each step, which token ids keep the output inside the grammar (a bitmask, one bit per id), and is
told each token that was sampled. Once the grammar is complete only the end-of-sequence token is
allowed, so a request ends on EOS with text that parses. ``servelab.sampling.constrained`` is the
teaching version of the same mask for a fixed set of strings (the tests check that the two agree).

Kinds (:class:`GrammarSpec`): ``json_schema`` (a schema as JSON text; ``{"type": "object"}`` is
OpenAI's ``json_object``), ``regex`` and ``choice`` (exactly one of some strings). JSON is compiled
with
``any_whitespace=False`` (xgrammar's ``", "`` / ``": "`` separators): a small model left free to add
whitespace tends to add it forever. Compact JSON then has no place for a raw control character
(U+0000 to U+001F: inside strings JSON requires them escaped), yet xgrammar 0.2.8 let a string with
a length bound take one, which a strict parser (Python's ``json.loads``) refuses; so a JSON grammar
also forbids every token whose bytes hold one (:attr:`Grammar.forbidden`).

System boundary: compile (CPU, milliseconds; a :class:`GrammarCompiler` caches what it compiled) and
per-step masks as a bool tensor ``[rows, vocab]`` on the CPU. Needs the ``xgrammar`` package.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "GrammarSpec",
    "Grammar",
    "Matcher",
    "GrammarCompiler",
    "SharedCompiler",
    "new_matcher",
    "allowed_masks",
    "accept",
    "greedy_mask_trace",
]

GRAMMAR_KINDS = ("json_schema", "regex", "choice")
_XGRAMMAR_LOCATION = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")  # "[12:00:00] /project/cpp/x.cc:83: "


@dataclass(frozen=True)
class GrammarSpec:
    """What a request constrains its output to: ``kind`` (one of :data:`GRAMMAR_KINDS`) and its text
    (schema JSON, regex) or strings (choice)."""

    kind: str
    spec: str | tuple[str, ...]

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"kind must be one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}")
        if self.kind == "choice":
            if (not isinstance(self.spec, tuple) or not self.spec
                    or not all(isinstance(s, str) and s for s in self.spec)):
                raise ValueError("a choice grammar needs a non-empty tuple of non-empty strings")
        elif not isinstance(self.spec, str) or not self.spec:
            raise ValueError(f"a {self.kind} grammar needs a non-empty string")


def choice_ebnf(choices: Sequence[str]) -> str:
    """An EBNF grammar accepting exactly one of ``choices`` (JSON string escapes are EBNF's too)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


@dataclass(frozen=True, eq=False)
class Grammar:
    """A compiled grammar: xgrammar's ``compiled`` plus ``forbidden`` ids (bool ``[vocab]``) or
    None."""

    compiled: object
    forbidden: torch.Tensor | None = None


@dataclass(eq=False)
class Matcher:
    """One sample's place in its grammar: xgrammar's matcher and the grammar's forbidden ids."""

    inner: object
    forbidden: torch.Tensor | None


class GrammarCompiler:
    """Compiles :class:`GrammarSpec` s for one tokenizer and model vocabulary (``vocab_size`` ids;
    the LM head may have more rows than the tokenizer has tokens); ``eos_id`` ends a completed
    grammar."""

    def __init__(self, tokenizer, vocab_size: int, eos_id: int | None) -> None:
        import xgrammar
        from transformers import PreTrainedTokenizerFast

        wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
        stop = None if eos_id is None else [eos_id]
        self.info = xgrammar.TokenizerInfo.from_huggingface(
            wrapped, vocab_size=vocab_size, stop_token_ids=stop
        )
        self._compiler = xgrammar.GrammarCompiler(self.info, max_threads=1)
        self.vocab_size = vocab_size
        control = [any(byte < 0x20 for byte in token) for token in self.info.decoded_vocab]
        self.control_tokens = torch.zeros(vocab_size, dtype=torch.bool)
        self.control_tokens[:len(control)] = torch.tensor(control[:vocab_size], dtype=torch.bool)

    def compile(self, grammar: GrammarSpec) -> Grammar:
        """The compiled :class:`Grammar`; ValueError with xgrammar's reason for a schema, regex or
        choice it cannot compile."""
        if not isinstance(grammar, GrammarSpec):
            raise TypeError(f"grammar must be a GrammarSpec, got {type(grammar).__name__}")
        try:
            if grammar.kind == "json_schema":
                return Grammar(
                    self._compiler.compile_json_schema(grammar.spec, any_whitespace=False),
                    self.control_tokens,
                )
            if grammar.kind == "regex":
                return Grammar(self._compiler.compile_regex(grammar.spec))
            return Grammar(self._compiler.compile_grammar(choice_ebnf(grammar.spec)))
        except (RuntimeError, ValueError) as exc:
            raise ValueError(_XGRAMMAR_LOCATION.sub("", str(exc)).strip() or repr(exc)) from None


class SharedCompiler:
    """A :class:`GrammarCompiler` built on first use (importing xgrammar and wrapping the tokenizer
    take a few seconds) and shared by threads: one compile at a time."""

    def __init__(self, tokenizer, vocab_size: int, eos_id: int | None) -> None:
        self._args = (tokenizer, vocab_size, eos_id)
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()

    def compile(self, grammar: GrammarSpec):
        """:meth:`GrammarCompiler.compile`; ValueError also when xgrammar is not installed."""
        with self._lock:
            if self._compiler is None:
                try:
                    self._compiler = GrammarCompiler(*self._args)
                except ImportError as exc:
                    raise ValueError(
                        f"structured outputs need the xgrammar package ({exc})"
                    ) from None
            return self._compiler.compile(grammar)


def new_matcher(grammar: Grammar) -> Matcher:
    """A fresh matcher (one per sample) at the start of ``grammar``."""
    import xgrammar

    if not isinstance(grammar, Grammar):
        raise TypeError(
            f"grammar must be a servelab.sampling.grammar.Grammar, got {type(grammar).__name__}"
        )
    return Matcher(xgrammar.GrammarMatcher(grammar.compiled), grammar.forbidden)


def allowed_masks(matchers: Sequence[Matcher], vocab_size: int) -> torch.Tensor:
    """Bool ``[len(matchers), vocab_size]`` on the CPU: True where the matcher allows the id
    next."""
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(len(matchers), vocab_size)
    for row, matcher in enumerate(matchers):
        matcher.inner.fill_next_token_bitmask(bitmask, row)
    # bit j of word w is id 32 w + j
    bits = (bitmask[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1
    masks = bits.reshape(len(matchers), -1)[:, :vocab_size].bool()
    for row, matcher in enumerate(matchers):
        if matcher.forbidden is not None:
            masks[row] &= ~matcher.forbidden
    return masks


def accept(matcher: Matcher, token: int) -> bool:
    """Advance ``matcher`` by the sampled ``token``; False if the grammar did not allow it."""
    return bool(matcher.inner.accept_token(token))


@torch.inference_mode()
def greedy_mask_trace(
    model, prompt_ids: Sequence[int], grammar: Grammar, max_steps: int
) -> list[dict]:
    """Greedy decoding under ``grammar`` with the unconstrained distribution beside it, one dict per
    step: ``allowed`` (how many ids the mask keeps), ``mass`` (the model's probability on them,
    before the mask), ``free`` / ``free_p`` (the model's own favourite and its probability) and
    ``chosen`` / ``chosen_p`` (the argmax over the allowed ids, and its unconstrained probability).
    Stops after the grammar's end-of-sequence token or ``max_steps`` steps. One dense forward per
    step (a teaching loop, no cache).
    """
    ids, matcher, rows = list(prompt_ids), new_matcher(grammar), []
    vocab = model.config.vocab_size
    for _ in range(max_steps):
        probs = torch.softmax(model(torch.tensor(ids))[-1].double(), dim=-1)
        mask = allowed_masks([matcher], vocab)[0]
        chosen = int(torch.where(mask, probs, -1.0).argmax())
        free = int(probs.argmax())
        rows.append(
            {
                "allowed": int(mask.sum()),
                "mass": float(probs[mask].sum()),
                "free": free,
                "free_p": float(probs[free]),
                "chosen": chosen,
                "chosen_p": float(probs[chosen]),
            }
        )
        accept(matcher, chosen)
        ids.append(chosen)
        if matcher.inner.is_terminated():
            break
    return rows
