"""What a request says about how its tokens are chosen: :class:`SamplingParams`, validated once.

Shared by the numpy reference pipeline (:mod:`servelab.sampling.pipeline`), the engine and the
server. This module needs only NumPy's scalar types, not the reference operations, so the engine
can import its configuration without them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from servelab._validate import require_index, require_interval
from servelab.prose import count

__all__ = ["FILTER_NAMES", "MAX_LOGPROBS", "SamplingParams", "as_int_tuple", "is_int"]

# most alternatives a request may ask for per token (OpenAI chat's top_logprobs limit)
MAX_LOGPROBS = 20

FILTER_NAMES = ("top_k", "top_p", "min_p", "typical")
"""The truncation filters :class:`SamplingParams.filter_order` may list, in the default order."""


def is_int(value: object) -> bool:
    """True for a Python or NumPy integer that is not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def as_int_tuple(value: object, name: str) -> tuple[int, ...]:
    """``value`` as a tuple of non-negative int token ids (``name`` is for the error message)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a sequence of int token ids")
    items = tuple(value)
    for item in items:
        if not is_int(item):
            raise TypeError(f"{name} must contain int token ids, got {type(item).__name__}")
        if item < 0:
            raise ValueError(f"{name} token ids must be >= 0, got {item}")
    return tuple(int(item) for item in items)


@dataclass(frozen=True)
class SamplingParams:
    """Everything a request says about how its tokens are chosen; immutable and hashable.

    Shared by the reference pipeline (:func:`~servelab.sampling.next_token_distribution`), the
    engine and the server. A disabled control has a neutral default: ``top_k=None``, ``top_p=1``,
    ``min_p=0``, ``typical_p=1``, penalties 0 (or 1 for the multiplicative one).

    Penalty scope (stated because APIs differ): ``frequency_penalty`` and ``presence_penalty`` count
    GENERATED tokens only (OpenAI / vLLM semantics); ``repetition_penalty`` applies to every token
    seen in the prompt or the output (Hugging Face / vLLM semantics). ``banned_sequences`` and
    ``no_repeat_ngram_size`` look at the generated tokens only.

    ``temperature=0`` selects greedy decoding (argmax, lowest id on ties) and ignores the truncation
    filters. ``max_tokens`` bounds generated tokens; ``stop`` strings end generation without being
    returned; ``ignore_eos`` keeps generating past EOS; ``seed`` makes a request's draws
    reproducible; ``n`` asks for that many independent samples of the same prompt.

    ``logprobs`` (engine and server only): report each generated token's log-probability plus that
    many most likely alternatives (0: the token's own only); ``prompt_logprobs`` the same for every
    prompt token after the first. Both are the raw model's ``log_softmax`` of the logits, before any
    of the processors above (vLLM's default ``logprobs_mode="raw_logprobs"``); None: not computed.
    ``grammar`` (engine only): a compiled xgrammar grammar
    (:class:`servelab.sampling.grammar.GrammarCompiler`); the engine masks every sample's next token
    to what the grammar allows, after the other processors and before temperature, so greedy
    decoding stays greedy over the allowed tokens.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    banned_sequences: tuple[tuple[int, ...], ...] = ()
    no_repeat_ngram_size: int = 0
    allowed_token_ids: tuple[int, ...] | None = None
    filter_order: tuple[str, ...] = FILTER_NAMES
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    grammar: object | None = field(default=None, hash=False)  # unhashable; equality compares it

    def __post_init__(self) -> None:
        self._set("temperature", require_interval("temperature", self.temperature, 0.0, math.inf,
                                             high_open=True))
        if self.top_k is not None:
            self._set("top_k", require_index("top_k", self.top_k, 1))
        self._set("top_p", require_interval("top_p", self.top_p, 0.0, 1.0, low_open=True))
        self._set("min_p", require_interval("min_p", self.min_p, 0.0, 1.0))
        self._set(
            "typical_p", require_interval("typical_p", self.typical_p, 0.0, 1.0, low_open=True)
        )
        for name in ("frequency_penalty", "presence_penalty"):
            self._set(name, require_interval(name, getattr(self, name), -2.0, 2.0))
        self._set(
            "repetition_penalty",
            require_interval(
                "repetition_penalty",
                self.repetition_penalty,
                0.0,
                math.inf,
                low_open=True,
                high_open=True,
            ),
        )
        self._set("logit_bias", self._normalise_logit_bias(self.logit_bias))
        self._set("banned_sequences", self._normalise_banned(self.banned_sequences))
        self._set(
            "no_repeat_ngram_size",
            require_index("no_repeat_ngram_size", self.no_repeat_ngram_size, 0),
        )
        if self.allowed_token_ids is not None:
            allowed = as_int_tuple(self.allowed_token_ids, "allowed_token_ids")
            if not allowed:
                raise ValueError("allowed_token_ids must be None or name at least one token")
            self._set("allowed_token_ids", allowed)
        self._set("filter_order", self._normalise_filter_order(self.filter_order))
        self._check_filters_listed()
        self._set("max_tokens", require_index("max_tokens", self.max_tokens, 1))
        self._set("stop", self._normalise_stop(self.stop))
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise TypeError(f"ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")
        self._set("ignore_eos", bool(self.ignore_eos))
        if self.seed is not None:
            self._set("seed", require_index("seed", self.seed, 0))
        self._set("n", require_index("n", self.n, 1))
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                self._set(name, require_index(name, getattr(self, name), 0, MAX_LOGPROBS))

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # the dataclass is frozen; normalise once, here

    @staticmethod
    def _normalise_logit_bias(value: object) -> tuple[tuple[int, float], ...]:
        pairs = value.items() if isinstance(value, Mapping) else value
        if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
            raise TypeError("logit_bias must be a mapping or a sequence of (token_id, bias) pairs")
        normalised: dict[int, float] = {}
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError("logit_bias entries must be (token_id, bias) pairs")
            (token,) = as_int_tuple([pair[0]], "logit_bias")
            if token in normalised:
                raise ValueError(f"logit_bias names token {token} twice")
            normalised[token] = require_interval(
                f"logit_bias[{token}]", pair[1], -math.inf, math.inf, low_open=True, high_open=True
            )
        return tuple(sorted(normalised.items()))

    @staticmethod
    def _normalise_banned(value: object) -> tuple[tuple[int, ...], ...]:
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise TypeError("banned_sequences must be a sequence of token-id sequences")
        sequences = tuple(as_int_tuple(seq, "banned_sequences") for seq in value)
        if any(len(seq) == 0 for seq in sequences):
            raise ValueError("banned_sequences must not contain an empty sequence")
        return sequences

    @staticmethod
    def _normalise_filter_order(value: object) -> tuple[str, ...]:
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise TypeError(f"filter_order must be a sequence of names from {FILTER_NAMES}")
        order = tuple(value)
        unknown = [name for name in order if name not in FILTER_NAMES]
        if unknown:
            raise ValueError(f"filter_order contains {unknown}; allowed names are {FILTER_NAMES}")
        if len(set(order)) != len(order):
            raise ValueError(f"filter_order must not repeat a name, got {order}")
        return order

    @staticmethod
    def _normalise_stop(value: object) -> tuple[str, ...]:
        stops = (value,) if isinstance(value, str) else value
        if not isinstance(stops, Iterable):
            raise TypeError("stop must be a string or a sequence of strings")
        stops = tuple(stops)
        if not all(isinstance(s, str) and s for s in stops):
            raise ValueError("stop must contain only non-empty strings")
        return stops

    def _filter_requested(self) -> dict[str, bool]:
        return {
            "top_k": self.top_k is not None,
            "top_p": self.top_p < 1.0,
            "min_p": self.min_p > 0.0,
            "typical": self.typical_p < 1.0,
        }

    def _check_filters_listed(self) -> None:
        missing = [name for name, on in self._filter_requested().items()
                   if on and name not in self.filter_order]
        if missing:
            raise ValueError(
                f"filter_order omits {count(len(missing), 'enabled filter')} {missing}; "
                "list every enabled filter"
            )

    def enabled_filters(self) -> tuple[str, ...]:
        """The names in ``filter_order`` whose filter would change something, in application
        order."""
        requested = self._filter_requested()
        return tuple(name for name in self.filter_order if requested[name])
