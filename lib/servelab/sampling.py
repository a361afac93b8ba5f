"""From one vector of next-token logits to one token id (course chapter on sampling).

System boundary: everything here works on a single request at a single decode step. The input is the
logit vector the model produced for the last position (one float per vocabulary entry, natural-log
units, unnormalised); the output is either a probability vector or one token id. Batching, devices and
KV memory live elsewhere; the engine's batched torch sampler mirrors the stage functions below one to
one, so a test can compare the two.

Conventions used throughout:

* Logits are 1-D float arrays (lists are accepted). ``-inf`` is a legal logit: it marks a masked token
  that can never be chosen. NaN and ``+inf`` are errors, and so is a vector where every token is masked.
* Probability vectors are 1-D float64 NumPy arrays that sum to 1. A token is in the *support* when its
  probability is strictly positive.
* Truncation filters (top-k, top-p, min-p, typical) take a probability vector and return a new,
  renormalised one with exact zeros outside the kept set, so they compose:
  ``top_p_filter(top_k_filter(softmax(logits), k=3), p=0.8)``.
* Ties are broken by token id: among equal scores the smaller id ranks first.
* Only :func:`sample` draws randomness, and only from the ``numpy.random.Generator`` it is handed.

The pipeline order this course teaches (one defensible order, not a standard every engine follows) is::

    hard constraints + logit bias -> penalties -> temperature -> truncation filters -> renormalise -> sample
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from servelab._validate import require_index, require_interval

__all__ = [
    "FILTER_NAMES",
    "MASS_TOLERANCE",
    "PROB_SUM_TOLERANCE",
    "BeamHypothesis",
    "SamplingParams",
    "apply_frequency_presence",
    "apply_hard_constraints",
    "apply_hard_mask",
    "apply_logit_bias",
    "apply_penalties",
    "apply_repetition_penalty",
    "apply_temperature",
    "apply_truncation_filters",
    "ban_sequences",
    "beam_search",
    "best_of_n_kv_tokens",
    "force_token",
    "greedy",
    "min_p_filter",
    "min_p_support_from_logits",
    "next_token_distribution",
    "no_repeat_ngram_mask",
    "sample",
    "sample_next_token",
    "softmax",
    "support",
    "temperature_probs",
    "temperature_from_probs",
    "token_counts",
    "top_k_filter",
    "top_p_filter",
    "typical_filter",
]

MASS_TOLERANCE = 1e-9
"""Slack used when a cumulative probability is compared with a mass threshold (top-p, typical).

A prefix "reaches" mass ``p`` when its float sum is ``>= p - MASS_TOLERANCE``. Without it, a sum such as
``0.35 + 0.33``, which is ``0.6799999999999999`` in binary floating point, would fail to reach ``0.68``
and pull one more token into the kept set."""

PROB_SUM_TOLERANCE = 1e-6
"""How far from 1 the sum of a probability vector handed to a filter may drift before it is rejected."""

MAX_LOGPROBS = 20  # most alternatives a request may ask for per token (OpenAI chat's top_logprobs limit)

FILTER_NAMES = ("top_k", "top_p", "min_p", "typical")
"""The truncation filters :class:`SamplingParams.filter_order` may list, in the default order."""

FloatVector = Sequence[float] | np.ndarray


# --------------------------------------------------------------------------------------------------
# Argument checks shared by every public function
# --------------------------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _check_logits(logits: FloatVector, name: str = "logits") -> np.ndarray:
    """Copy ``logits`` into a float64 vector; reject NaN, +inf, empty and fully masked input."""
    try:
        z = np.array(logits, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D sequence of real numbers") from exc
    if z.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one score per vocabulary entry), got shape {z.shape}")
    if z.size == 0:
        raise ValueError(f"{name} must contain at least one token, got an empty vector")
    if np.isnan(z).any() or np.isposinf(z).any():
        raise ValueError(f"{name} must be finite or -inf (a masked token); NaN and +inf are not allowed")
    if not np.isfinite(z).any():
        raise ValueError(f"{name} has every token masked (-inf); at least one must be finite")
    return z


def _check_probs(probs: FloatVector, name: str = "probs") -> np.ndarray:
    """Copy ``probs`` into a float64 vector that is non-negative and sums to 1 (within tolerance)."""
    try:
        p = np.array(probs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D sequence of probabilities") from exc
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D vector, got shape {p.shape}")
    if not np.isfinite(p).all() or (p < 0).any():
        raise ValueError(f"{name} entries must be finite and >= 0")
    total = float(p.sum())
    if abs(total - 1.0) > PROB_SUM_TOLERANCE:
        raise ValueError(f"{name} must sum to 1 (within {PROB_SUM_TOLERANCE}), got {total!r}")
    return p / total


def _check_token_ids(ids: Iterable[int], vocab_size: int, name: str) -> list[int]:
    """Return ``ids`` as a list of ints, each a valid index into a vocabulary of ``vocab_size``."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{name} must be an iterable of token ids")
    checked = []
    for token in ids:
        if not _is_int(token):
            raise TypeError(f"{name} must contain int token ids, got {type(token).__name__}")
        if not 0 <= token < vocab_size:
            raise ValueError(f"{name} token id {token} is outside [0, {vocab_size - 1}]")
        checked.append(int(token))
    return checked


def _renormalise(weights: np.ndarray) -> np.ndarray:
    return weights / weights.sum()


def _ranked_by_prob(p: np.ndarray) -> np.ndarray:
    """Token ids of the support, highest probability first, ties broken by the smaller id."""
    eligible = np.flatnonzero(p > 0)
    order = np.argsort(-p[eligible], kind="stable")
    return eligible[order]


def _keep(p: np.ndarray, kept_ids: np.ndarray) -> np.ndarray:
    """Zero every entry outside ``kept_ids`` and renormalise the rest."""
    out = np.zeros_like(p)
    out[kept_ids] = p[kept_ids]
    return _renormalise(out)


def _prefix_reaching(masses: np.ndarray, threshold: float) -> int:
    """Length of the shortest prefix of ``masses`` whose sum reaches ``threshold`` (see MASS_TOLERANCE)."""
    cumulative = np.cumsum(masses)
    reached = np.flatnonzero(cumulative >= threshold - MASS_TOLERANCE)
    return int(reached[0]) + 1 if reached.size else masses.size


# --------------------------------------------------------------------------------------------------
# Softmax, temperature, greedy
# --------------------------------------------------------------------------------------------------


def softmax(logits: FloatVector) -> np.ndarray:
    """Turn logits into probabilities: ``p_i = exp(z_i - z_max) / sum_j exp(z_j - z_max)``.

    Subtracting the largest finite logit first keeps every exponent <= 0, so nothing overflows.
    Masked tokens (``-inf``) get probability exactly 0.
    """
    z = _check_logits(logits)
    weights = np.exp(z - z[np.isfinite(z)].max())
    return _renormalise(weights)


def apply_temperature(logits: FloatVector, temperature: float) -> np.ndarray:
    """Divide logits by a strictly positive temperature ``T`` (dimensionless); ``-inf`` stays ``-inf``.

    ``T = 0`` is rejected here on purpose: greedy decoding is a separate branch, never ``z / 0``.
    """
    z = _check_logits(logits)
    t = require_interval("temperature", temperature, 0.0, math.inf, low_open=True, high_open=True)
    return z / t


def temperature_probs(logits: FloatVector, temperature: float) -> np.ndarray:
    """Probabilities ``softmax(z / T)`` for ``T > 0``; raises ValueError for ``T <= 0``.

    ``T < 1`` sharpens the distribution, ``T > 1`` flattens it, and the ranking never changes.
    """
    return softmax(apply_temperature(logits, temperature))


def temperature_from_probs(probs: FloatVector, temperature: float) -> np.ndarray:
    """Temperature applied to probabilities instead of logits: ``q_i = p_i^(1/T) / sum_j p_j^(1/T)``.

    For ``p = softmax(z)`` this equals ``softmax(z / T)``, because ``p_i^(1/T)`` is ``e^(z_i/T)`` up to
    a factor common to every token. (Dividing probabilities by ``T`` instead changes nothing: the
    factor cancels.) Tokens with ``p_i = 0`` stay at 0; ``T`` must be > 0.
    """
    p = _check_probs(probs)
    t = require_interval("temperature", temperature, 0.0, math.inf, low_open=True, high_open=True)
    kept = p > 0
    log_weights = np.full(p.shape, -math.inf)
    log_weights[kept] = np.log(p[kept]) / t
    return softmax(log_weights)


def greedy(logits: FloatVector) -> int:
    """The argmax token id; on a tie for the maximum the lowest id wins. No softmax is needed."""
    z = _check_logits(logits)
    return int(np.argmax(z))  # np.argmax returns the first maximum, i.e. the lowest id


def support(probs: FloatVector) -> list[int]:
    """Token ids with strictly positive probability, in ascending id order."""
    p = _check_probs(probs)
    return [int(i) for i in np.flatnonzero(p > 0)]


# --------------------------------------------------------------------------------------------------
# Truncation filters: probability vector in, renormalised probability vector out
# --------------------------------------------------------------------------------------------------


def top_k_filter(probs: FloatVector, k: int) -> np.ndarray:
    """Keep the ``k`` most probable tokens, ranked by ``(-p_i, token id)``, and renormalise.

    Exactly ``min(k, |E|)`` tokens survive, where ``E`` is the current support. Top-k truncates only
    for ``1 <= k < |E|``; a larger ``k`` is accepted as a
    no-op rather than an error, because one request's ``top_k`` stays fixed while masks shrink ``E``
    from step to step. ``k`` must be an int >= 1 (``None`` for "disabled" is handled by
    :class:`SamplingParams`, not here).
    """
    p = _check_probs(probs)
    k = require_index("k", k, 1)
    return _keep(p, _ranked_by_prob(p)[:k])


def top_p_filter(probs: FloatVector, p: float) -> np.ndarray:
    """Nucleus filter: keep the shortest probability-sorted prefix whose mass reaches ``p``.

    The token that crosses the threshold is kept, so the kept mass can exceed ``p``. ``p`` must lie in
    ``(0, 1]``; ``p = 1`` keeps the whole support. Reaching is tested with :data:`MASS_TOLERANCE`.
    """
    probs_ = _check_probs(probs)
    threshold = require_interval("p", p, 0.0, 1.0, low_open=True)
    ranked = _ranked_by_prob(probs_)
    if threshold == 1.0:
        return _keep(probs_, ranked)
    return _keep(probs_, ranked[: _prefix_reaching(probs_[ranked], threshold)])


def min_p_filter(probs: FloatVector, alpha: float) -> np.ndarray:
    """Keep tokens with ``p_i >= alpha * max_j p_j`` and renormalise; ``alpha`` in ``[0, 1]``.

    The most probable token always survives; ``alpha = 0`` keeps the whole support.
    """
    p = _check_probs(probs)
    a = require_interval("alpha", alpha, 0.0, 1.0)
    kept = np.flatnonzero((p > 0) & (p >= a * p.max()))
    return _keep(p, kept)


def min_p_support_from_logits(logits: FloatVector, temperature: float, alpha: float) -> list[int]:
    """The min-p support of ``softmax(z / T)`` computed in logit space: ``z_i >= z_max + T log alpha``.

    This form shows why the min-p support grows with temperature: the allowed gap below the best
    logit is ``T * |log alpha|``. ``temperature > 0``, ``alpha`` in ``[0, 1]`` (``alpha = 0`` keeps
    every unmasked token).
    """
    z = _check_logits(logits)
    t = require_interval("temperature", temperature, 0.0, math.inf, low_open=True, high_open=True)
    a = require_interval("alpha", alpha, 0.0, 1.0)
    finite = np.isfinite(z)
    if a == 0.0:
        return [int(i) for i in np.flatnonzero(finite)]
    threshold = z[finite].max() + t * math.log(a)
    return [int(i) for i in np.flatnonzero(finite & (z >= threshold))]


def typical_filter(probs: FloatVector, mass: float) -> np.ndarray:
    """Locally typical filter: rank tokens by ``|-log p_i - H(p)|`` and keep the shortest prefix
    whose probability mass reaches ``mass``; renormalise.

    ``H(p) = -sum p_i log p_i`` is the entropy in nats. Tokens whose surprisal is closest to the
    average go first, so the most probable token can be excluded. ``mass`` in ``(0, 1]``; ``1`` keeps
    the whole support. Ties in the distance are broken by the smaller token id.
    """
    p = _check_probs(probs)
    threshold = require_interval("mass", mass, 0.0, 1.0, low_open=True)
    eligible = np.flatnonzero(p > 0)
    if threshold == 1.0:
        return _keep(p, eligible)
    surprisal = -np.log(p[eligible])
    entropy = float(np.sum(p[eligible] * surprisal))
    ranked = eligible[np.argsort(np.abs(surprisal - entropy), kind="stable")]
    return _keep(p, ranked[: _prefix_reaching(p[ranked], threshold)])


# --------------------------------------------------------------------------------------------------
# Penalties: reshape the logits of tokens that already appeared
# --------------------------------------------------------------------------------------------------


def token_counts(token_ids: Iterable[int], vocab_size: int) -> np.ndarray:
    """How many times each vocabulary entry occurs in ``token_ids``: an int64 vector of ``vocab_size``."""
    size = require_index("vocab_size", vocab_size, 1)
    ids = _check_token_ids(token_ids, size, "token_ids")
    return np.bincount(np.asarray(ids, dtype=np.int64), minlength=size)


def apply_frequency_presence(logits: FloatVector, counts: FloatVector, frequency: float,
                             presence: float) -> np.ndarray:
    """``z_i' = z_i - frequency * c_i - presence * [c_i > 0]`` (OpenAI-style additive penalties).

    ``counts`` holds one non-negative occurrence count per vocabulary entry (see :func:`token_counts`).
    The frequency term grows with every repetition; the presence term is paid once. Both coefficients
    must be finite (negative values reward repetition); :class:`SamplingParams` narrows them to
    ``[-2, 2]``. Which tokens are counted is the caller's choice; the pipeline counts generated
    tokens only.
    """
    z = _check_logits(logits)
    c = np.asarray(counts, dtype=np.float64)
    if c.shape != z.shape:
        raise ValueError(f"counts must have one entry per token, shape {z.shape}, got {c.shape}")
    if not np.isfinite(c).all() or (c < 0).any():
        raise ValueError("counts entries must be finite and >= 0")
    f = require_interval("frequency", frequency, -math.inf, math.inf, low_open=True, high_open=True)
    pr = require_interval("presence", presence, -math.inf, math.inf, low_open=True, high_open=True)
    return z - f * c - pr * (c > 0)


def apply_repetition_penalty(logits: FloatVector, seen_ids: Iterable[int], penalty: float) -> np.ndarray:
    """Sign-aware multiplicative penalty (CTRL / Hugging Face style) on every token in ``seen_ids``.

    A positive logit is divided by ``penalty`` and a negative one multiplied by it, so with
    ``penalty > 1`` both move down (``-2`` becomes ``-2.4`` at 1.2, not ``-1.667``). Zero and ``-inf``
    are unchanged. ``penalty`` must be finite and ``> 0``; ``1`` is a no-op and values below 1 reward
    repetition. Each seen token is penalised once, however often it occurred.
    """
    z = _check_logits(logits)
    r = require_interval("penalty", penalty, 0.0, math.inf, low_open=True, high_open=True)
    seen = np.unique(np.asarray(_check_token_ids(seen_ids, z.size, "seen_ids"), dtype=np.int64))
    picked = z[seen]
    z[seen] = np.where(picked > 0, picked / r, picked * r)
    return z


def apply_logit_bias(logits: FloatVector, bias: Mapping[int, float] | Iterable[tuple[int, float]]) -> np.ndarray:
    """Add a fixed, finite offset to chosen tokens' logits: ``z_i' = z_i + bias[i]``.

    ``bias`` maps token id to offset (a dict or ``(token_id, offset)`` pairs). A masked token stays
    masked; to forbid a token use a mask, not a huge negative bias.
    """
    z = _check_logits(logits)
    pairs = bias.items() if isinstance(bias, Mapping) else bias
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
        raise TypeError("bias must be a mapping or an iterable of (token_id, offset) pairs")
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError("bias entries must be (token_id, offset) pairs")
        (token,) = _check_token_ids([pair[0]], z.size, "bias")
        offset = pair[1]
        z[token] += require_interval(f"bias[{token}]", offset, -math.inf, math.inf, low_open=True,
                                high_open=True)
    return z


# --------------------------------------------------------------------------------------------------
# Masks: every hard constraint sets illegal logits to -inf, then sampling proceeds as usual
# --------------------------------------------------------------------------------------------------


def apply_hard_mask(logits: FloatVector, allowed_ids: Iterable[int]) -> np.ndarray:
    """Set every logit outside ``allowed_ids`` to ``-inf`` (the primitive behind grammar/JSON decoding).

    The result may have every token masked if all allowed tokens were already masked; the next
    softmax then raises.
    """
    z = _check_logits(logits)
    allowed = _check_token_ids(allowed_ids, z.size, "allowed_ids")
    if not allowed:
        raise ValueError("allowed_ids must name at least one token")
    keep = np.zeros(z.size, dtype=bool)
    keep[allowed] = True
    z[~keep] = -np.inf
    return z


def force_token(logits: FloatVector, token_id: int) -> np.ndarray:
    """Leave only ``token_id`` eligible: a hard mask whose allowed set has one element."""
    return apply_hard_mask(logits, [token_id])


def ban_sequences(logits: FloatVector, generated_ids: Sequence[int],
                  banned: Iterable[Sequence[int]]) -> np.ndarray:
    """Mask token ``t`` when ``generated_ids + [t]`` would end with one of the ``banned`` sequences.

    A banned sequence ``(a, b, c)`` only masks ``c``, and only right after ``a, b`` was generated; a
    length-1 sequence ``(t,)`` bans ``t`` at every step.
    """
    z = _check_logits(logits)
    history = _check_token_ids(generated_ids, z.size, "generated_ids")
    for sequence in banned:
        ids = _check_token_ids(sequence, z.size, "banned")
        if not ids:
            raise ValueError("banned sequences must each contain at least one token id")
        prefix, last = ids[:-1], ids[-1]
        if len(prefix) <= len(history) and history[len(history) - len(prefix):] == prefix:
            z[last] = -np.inf
    return z


def no_repeat_ngram_mask(logits: FloatVector, generated_ids: Sequence[int], n: int) -> np.ndarray:
    """Mask every token that would repeat an n-gram already present in ``generated_ids``.

    The last ``n - 1`` generated tokens form the context; wherever that context occurred earlier, the
    token that followed it is masked. ``n`` is an int >= 1 (``n = 1`` bans every token seen so far).
    """
    z = _check_logits(logits)
    size = require_index("n", n, 1)
    history = _check_token_ids(generated_ids, z.size, "generated_ids")
    if len(history) < size - 1:
        return z
    context = history[len(history) - (size - 1):]
    for start in range(len(history) - size + 1):
        if history[start:start + size - 1] == context:
            z[history[start + size - 1]] = -np.inf
    return z


# --------------------------------------------------------------------------------------------------
# Drawing one token
# --------------------------------------------------------------------------------------------------


def sample(probs: FloatVector, rng: np.random.Generator) -> int:
    """Draw one token id from ``probs`` by inverse CDF: the only function here that uses randomness.

    One uniform ``u = rng.random()`` in ``[0, 1)`` is drawn and the first id whose cumulative
    probability exceeds ``u`` is returned. Exactly one draw happens on every call, even when a single
    token survives, so the generator's stream advances the same way whatever the distribution (a
    batched torch sampler that draws one uniform per row reproduces the same choices).
    """
    p = _check_probs(probs)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    u = rng.random()
    cumulative = np.cumsum(p)
    index = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    last_eligible = int(np.flatnonzero(p > 0)[-1])
    return min(index, last_eligible)  # guards the float edge where u * total rounds up to the total


# --------------------------------------------------------------------------------------------------
# Request-level parameters and the full pipeline
# --------------------------------------------------------------------------------------------------


def _as_int_tuple(value: object, name: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a sequence of int token ids")
    items = tuple(value)
    for item in items:
        if not _is_int(item):
            raise TypeError(f"{name} must contain int token ids, got {type(item).__name__}")
        if item < 0:
            raise ValueError(f"{name} token ids must be >= 0, got {item}")
    return tuple(int(item) for item in items)


@dataclass(frozen=True)
class SamplingParams:
    """Everything a request says about how its tokens are chosen; immutable and hashable.

    Shared by the reference pipeline (:func:`next_token_distribution`), the engine and the server.
    A disabled control has a neutral default: ``top_k=None``, ``top_p=1``, ``min_p=0``,
    ``typical_p=1``, penalties 0 (or 1 for the multiplicative one).

    Penalty scope (stated because APIs differ): ``frequency_penalty`` and ``presence_penalty`` count
    GENERATED tokens only (OpenAI / vLLM semantics); ``repetition_penalty`` applies to every token
    seen in the prompt or the output (Hugging Face / vLLM semantics). ``banned_sequences`` and
    ``no_repeat_ngram_size`` look at the generated tokens only.

    ``temperature=0`` selects greedy decoding (argmax, lowest id on ties) and ignores the truncation
    filters. ``max_tokens`` bounds generated tokens; ``stop`` strings end generation without being
    returned; ``ignore_eos`` keeps generating past EOS; ``seed`` makes a request's draws reproducible;
    ``n`` asks for that many independent samples of the same prompt.

    ``logprobs`` (engine and server only): report each generated token's log-probability plus that many
    most likely alternatives (0: the token's own only); ``prompt_logprobs`` the same for every prompt
    token after the first. Both are the raw model's ``log_softmax`` of the logits, before any of the
    processors above (vLLM's default ``logprobs_mode="raw_logprobs"``); None: not computed.
    ``grammar`` (engine only): a compiled xgrammar grammar (:class:`servelab.grammar.GrammarCompiler`);
    the engine masks every sample's next token to what the grammar allows, after the other processors
    and before temperature, so greedy decoding stays greedy over the allowed tokens.
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
        self._set("typical_p", require_interval("typical_p", self.typical_p, 0.0, 1.0, low_open=True))
        for name in ("frequency_penalty", "presence_penalty"):
            self._set(name, require_interval(name, getattr(self, name), -2.0, 2.0))
        self._set("repetition_penalty", require_interval("repetition_penalty", self.repetition_penalty,
                                                    0.0, math.inf, low_open=True, high_open=True))
        self._set("logit_bias", self._normalise_logit_bias(self.logit_bias))
        self._set("banned_sequences", self._normalise_banned(self.banned_sequences))
        self._set("no_repeat_ngram_size", require_index("no_repeat_ngram_size", self.no_repeat_ngram_size, 0))
        if self.allowed_token_ids is not None:
            allowed = _as_int_tuple(self.allowed_token_ids, "allowed_token_ids")
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
            (token,) = _as_int_tuple([pair[0]], "logit_bias")
            if token in normalised:
                raise ValueError(f"logit_bias names token {token} twice")
            normalised[token] = require_interval(f"logit_bias[{token}]", pair[1], -math.inf, math.inf,
                                            low_open=True, high_open=True)
        return tuple(sorted(normalised.items()))

    @staticmethod
    def _normalise_banned(value: object) -> tuple[tuple[int, ...], ...]:
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise TypeError("banned_sequences must be a sequence of token-id sequences")
        sequences = tuple(_as_int_tuple(seq, "banned_sequences") for seq in value)
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
            raise ValueError(f"filter_order omits enabled filter(s) {missing}; list every enabled filter")

    def enabled_filters(self) -> tuple[str, ...]:
        """The names in ``filter_order`` whose filter would change something, in application order."""
        requested = self._filter_requested()
        return tuple(name for name in self.filter_order if requested[name])


def _check_params(params: object) -> SamplingParams:
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    return params


def apply_hard_constraints(logits: FloatVector, params: SamplingParams,
                           output_ids: Sequence[int] = ()) -> np.ndarray:
    """Stage 1: allowed-token mask, banned sequences, no-repeat n-gram mask, then logit bias."""
    p = _check_params(params)
    z = _check_logits(logits)
    if p.allowed_token_ids is not None:
        z = apply_hard_mask(z, p.allowed_token_ids)
    if p.banned_sequences and np.isfinite(z).any():
        z = ban_sequences(z, output_ids, p.banned_sequences)
    if p.no_repeat_ngram_size > 0 and np.isfinite(z).any():
        z = no_repeat_ngram_mask(z, output_ids, p.no_repeat_ngram_size)
    if p.logit_bias and np.isfinite(z).any():
        z = apply_logit_bias(z, p.logit_bias)
    if not np.isfinite(z).any():
        raise ValueError("params leave no eligible token: the hard constraints mask every token")
    return z


def apply_penalties(logits: FloatVector, params: SamplingParams, prompt_ids: Sequence[int] = (),
                    output_ids: Sequence[int] = ()) -> np.ndarray:
    """Stage 2: frequency/presence penalties on output counts, repetition penalty on prompt + output."""
    p = _check_params(params)
    z = _check_logits(logits)
    if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
        counts = token_counts(output_ids, z.size)
        z = apply_frequency_presence(z, counts, p.frequency_penalty, p.presence_penalty)
    if p.repetition_penalty != 1.0:
        z = apply_repetition_penalty(z, [*prompt_ids, *output_ids], p.repetition_penalty)
    return z


def apply_truncation_filters(probs: FloatVector, params: SamplingParams) -> np.ndarray:
    """Stage 4: run each enabled filter in ``params.filter_order`` on the current distribution."""
    p = _check_params(params)
    current = _check_probs(probs)
    filters: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "top_k": lambda q: top_k_filter(q, p.top_k),
        "top_p": lambda q: top_p_filter(q, p.top_p),
        "min_p": lambda q: min_p_filter(q, p.min_p),
        "typical": lambda q: typical_filter(q, p.typical_p),
    }
    for name in p.enabled_filters():
        current = filters[name](current)
    return current


def next_token_distribution(logits: FloatVector, params: SamplingParams,
                            prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()) -> np.ndarray:
    """The final probability vector one decode step samples from, under ``params``.

    Stages: hard constraints and logit bias -> penalties -> temperature -> truncation filters in
    ``params.filter_order`` -> renormalise. With ``temperature == 0`` the result is a one-hot vector at
    the greedy argmax of the constrained, penalised logits, taken before any division. ``prompt_ids``
    and ``output_ids`` are the request's prompt and generated token ids so far.
    """
    p = _check_params(params)
    z = apply_hard_constraints(logits, p, output_ids)
    z = apply_penalties(z, p, prompt_ids, output_ids)
    if p.temperature == 0.0:
        one_hot = np.zeros(z.size)
        one_hot[greedy(z)] = 1.0
        return one_hot
    return apply_truncation_filters(temperature_probs(z, p.temperature), p)


def sample_next_token(logits: FloatVector, params: SamplingParams, rng: np.random.Generator,
                      prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()) -> int:
    """Build :func:`next_token_distribution` and draw one token from it with :func:`sample`.

    Every call consumes exactly one uniform from ``rng``, greedy requests included.
    """
    return sample(next_token_distribution(logits, params, prompt_ids, output_ids), rng)


# --------------------------------------------------------------------------------------------------
# Beyond one draw: beam search and best-of-n memory
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BeamHypothesis:
    """One finished beam: generated token ids, total log-probability (nats) and normalised score."""

    token_ids: tuple[int, ...]
    log_prob: float
    score: float
    ended_with_eos: bool = False


def _length_normalised(log_prob: float, length: int, length_alpha: float) -> float:
    """``S(y) = log P(y) / |y| ** alpha`` with ``|y|`` the generated length."""
    return log_prob / (max(length, 1) ** length_alpha)


def beam_search(step_logprobs: Callable[[list[tuple[int, ...]]], np.ndarray], prompt_ids: Sequence[int],
                beam_width: int, max_new_tokens: int, eos_id: int | None = None,
                length_alpha: float = 1.0) -> list[BeamHypothesis]:
    """Approximate the most likely continuation by keeping the ``beam_width`` best partial sequences.

    ``step_logprobs(sequences)`` receives the live sequences (prompt + generated, as tuples) and
    returns a 2-D array of next-token log-probabilities, one row per sequence. Each step scores every
    extension by cumulative ``log P``, keeps the best ``beam_width`` (ties: earlier beam, then smaller
    token id), and retires an extension that emits ``eos_id`` as finished when it ranks within the top
    ``beam_width``; the live set is refilled from the remaining extensions. Because everything outside
    the beam is pruned, the result is not guaranteed to be globally optimal. The final ranking uses
    ``S(y) = log P(y) / |y| ** length_alpha`` (``|y|`` counts generated tokens, EOS included), one
    common normalisation among several. Returns at most ``beam_width`` hypotheses, best first.
    """
    if not callable(step_logprobs):
        raise TypeError("step_logprobs must be callable: sequences -> 2-D array of log-probs")
    prompt = _as_int_tuple(prompt_ids, "prompt_ids")
    width = require_index("beam_width", beam_width, 1)
    steps = require_index("max_new_tokens", max_new_tokens, 1)
    if eos_id is not None:
        (eos_id,) = _as_int_tuple([eos_id], "eos_id")
    alpha = require_interval("length_alpha", length_alpha, 0.0, math.inf, high_open=True)

    live: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    finished: list[tuple[tuple[int, ...], float, bool]] = []
    for _ in range(steps):
        table = np.asarray(step_logprobs([prompt + generated for generated, _ in live]), dtype=np.float64)
        if table.ndim != 2 or table.shape[0] != len(live):
            raise ValueError(f"step_logprobs must return shape ({len(live)}, vocab), got {table.shape}")
        totals = np.array([lp for _, lp in live])[:, None] + table
        flat = np.argsort(-totals, axis=None, kind="stable")  # row-major: earlier beam, smaller id
        next_live: list[tuple[tuple[int, ...], float]] = []
        for rank, index in enumerate(flat):
            beam, token = divmod(int(index), table.shape[1])
            total = float(totals[beam, token])
            if len(next_live) == width or not math.isfinite(total):
                break
            extended = live[beam][0] + (token,)
            if token == eos_id:
                if rank < width:
                    finished.append((extended, total, True))
            else:
                next_live.append((extended, total))
        live = next_live
        if not live:
            break
    finished.extend((generated, lp, False) for generated, lp in live)
    hypotheses = [BeamHypothesis(tokens, lp, _length_normalised(lp, len(tokens), alpha), eos)
                  for tokens, lp, eos in finished]
    hypotheses.sort(key=lambda h: -h.score)
    return hypotheses[:width]


def best_of_n_kv_tokens(prompt_tokens: int, generated_tokens: int, n: int,
                        shared_prefix: bool = True) -> int:
    """KV-cache size, in token slots, of ``n`` parallel samples of one prompt.

    With the prompt's KV shared copy-on-write, ``M = M_prompt + n * M_gen``; without sharing every
    sample holds its own copy, ``M = n * (M_prompt + M_gen)``. Multiply by bytes per token (see
    ``servelab.kv``) for bytes. Block rounding is ignored here.
    """
    prompt = require_index("prompt_tokens", prompt_tokens, 0)
    generated = require_index("generated_tokens", generated_tokens, 0)
    samples = require_index("n", n, 1)
    if not isinstance(shared_prefix, bool):
        raise TypeError(f"shared_prefix must be a bool, got {type(shared_prefix).__name__}")
    return prompt + samples * generated if shared_prefix else samples * (prompt + generated)
