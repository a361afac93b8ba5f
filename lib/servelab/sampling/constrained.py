"""Constrained decoding as a mask: which tokens may come next so the output stays legal.

System boundary: one request at one decode step, before sampling. The input is the text emitted so
far under the constraint (the automaton's *state*) and, optionally, how many tokens the request may
still produce; the output is the list of legal token ids, which :func:`constrained_logits` turns
into a hard mask with :func:`servelab.sampling.apply_hard_mask`. The sampler itself is unchanged.

The constraint here is the simplest useful one: the output must be exactly one of a fixed set of
strings (for example ``"ROMEO:\\n"`` or ``"JULIET:\\n"``). Legality is decided on token *text*, not
on token ids, so every spelling of an allowed string counts, not only the tokenizer's canonical one:

* a token is *prefix-legal* when ``state + text(token)`` is still a prefix of some allowed string;
* under a token budget that is not enough: a prefix-legal token can leave more text than the
  remaining tokens can spell (a *dead end*). The *look-ahead* mask also requires that the fewest
  tokens needed to finish some allowed string from the new state fit in the budget that is left.

The fewest tokens that spell each suffix of each allowed string is a shortest path over character
positions, computed once per string when the automaton is built (time ~ total length x vocabulary).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from servelab._validate import require_int
from servelab.sampling import apply_hard_mask

__all__ = ["ChoiceAutomaton", "allowed_token_ids", "constrained_logits"]

UNDECODABLE = "\ufffd"
"""The replacement character: a token whose text contains it is part of a multi-byte character and
never used to spell an allowed string (its text alone is not what it contributes)."""


def _require_strings(name: str, values: object, *, allow_empty_items: bool) -> list[str]:
    """Return ``values`` as a non-empty list of ``str`` (non-empty items unless allowed)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of str, got {type(values).__name__}")
    if not values:
        raise ValueError(f"{name} must contain at least one string")
    for item in values:
        if not isinstance(item, str):
            raise TypeError(f"{name} must contain only str, got {type(item).__name__}")
        if not item and not allow_empty_items:
            raise ValueError(f"{name} must not contain an empty string")
    return list(values)


def _require_state(state: object) -> str:
    if not isinstance(state, str):
        raise TypeError(
            f"state must be a str (the text emitted so far), got {type(state).__name__}"
        )
    return state


class ChoiceAutomaton:
    """Accepts exactly the strings in ``choices``, spelled by tokens whose texts are ``vocab``.

    ``vocab[i]`` is the decoded text of token id ``i``. The state is the text emitted so far (a
    ``str``; ``""`` at the start). ``spell_cost[c][i]`` is the fewest tokens that spell ``c[i:]``
    (``math.inf`` when the vocabulary cannot spell it).
    """

    def __init__(self, choices: Sequence[str], vocab: Sequence[str]) -> None:
        self.choices = _require_strings("choices", choices, allow_empty_items=False)
        self.vocab = _require_strings("vocab", vocab, allow_empty_items=True)
        self.usable = [i for i, text in enumerate(self.vocab) if text and UNDECODABLE not in text]
        self.spell_cost = {c: self._suffix_costs(c) for c in self.choices}

    def _suffix_costs(self, text: str) -> list[float]:
        """Fewest tokens spelling ``text[i:]`` for every ``i`` (a shortest path, right to left)."""
        cost = [math.inf] * len(text) + [0]
        for i in range(len(text) - 1, -1, -1):
            for t in self.usable:
                if text.startswith(self.vocab[t], i):
                    cost[i] = min(cost[i], 1 + cost[i + len(self.vocab[t])])
        return cost

    def live(self, state: str) -> list[str]:
        """Allowed strings still reachable from ``state`` (those it is a prefix of)."""
        state = _require_state(state)
        return [c for c in self.choices if c.startswith(state)]

    def tokens_to_finish(self, state: str) -> float:
        """Fewest tokens that complete some allowed string from ``state`` (``math.inf`` if none)."""
        return min((self.spell_cost[c][len(state)] for c in self.live(state)), default=math.inf)

    def prefix_legal(self, state: str) -> list[int]:
        """Token ids that keep the text a prefix of some allowed string (no look-ahead)."""
        state = _require_state(state)
        return [t for t in self.usable if self.live(state + self.vocab[t])]

    def legal(self, state: str, budget: int) -> list[int]:
        """Prefix-legal token ids after which some allowed string can still be finished within the
        ``budget - 1`` tokens that remain (``budget`` counts this step; an int >= 1)."""
        budget = require_int("budget", budget, 1)
        return [t for t in self.prefix_legal(state)
                if self.tokens_to_finish(state + self.vocab[t]) <= budget - 1]

    def accepts(self, state: str) -> bool:
        """True when ``state`` is exactly one of the allowed strings."""
        return _require_state(state) in self.choices


def allowed_token_ids(
    automaton: ChoiceAutomaton, state: str, budget: int | None = None
) -> list[int]:
    """The legal token ids in ``state``: prefix-only when ``budget`` is ``None``, otherwise the
    look-ahead set for ``budget`` tokens left (this step included). Empty at a dead end."""
    if not isinstance(automaton, ChoiceAutomaton):
        raise TypeError(f"automaton must be a ChoiceAutomaton, got {type(automaton).__name__}")
    if budget is None:
        return automaton.prefix_legal(state)
    return automaton.legal(state, budget)


def constrained_logits(logits: Sequence[float] | np.ndarray, automaton: ChoiceAutomaton, state: str,
                       budget: int | None = None) -> np.ndarray:
    """``logits`` (one per vocabulary entry) with every illegal token set to ``-inf``.

    Raises ValueError at a dead end (no legal token): the caller must stop, not sample.
    """
    allowed = allowed_token_ids(automaton, state, budget)
    if not allowed:
        raise ValueError(f"state {state!r} is a dead end: no token is legal")
    return apply_hard_mask(logits, allowed)
