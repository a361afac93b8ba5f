"""The numpy reference operations: from one vector of next-token logits to one token id.

System boundary: everything here works on a single request at a single decode step. The input is the
logit vector the model produced for the last position (one float per vocabulary entry, natural-log
units, unnormalised); the output is either a probability vector or one token id. Batching, devices
and KV memory live elsewhere; the engine's batched torch sampler mirrors these operations (staged in
:mod:`servelab.sampling.pipeline`) one to one, so a test can compare the two.

Conventions used throughout:

* Logits are 1-D float arrays (lists are accepted). ``-inf`` is a legal logit: it marks a masked
  token that can never be chosen. NaN and ``+inf`` are errors, and so is a vector where every token
  is masked.
* Probability vectors are 1-D float64 NumPy arrays that sum to 1. A token is in the *support* when
  its probability is strictly positive.
* Truncation filters (top-k, top-p, min-p, typical) take a probability vector and return a new,
  renormalised one with exact zeros outside the kept set, so they compose:
  ``top_p_filter(top_k_filter(softmax(logits), k=3), p=0.8)``.
* Ties are broken by token id: among equal scores the smaller id ranks first.
* Only :func:`sample` draws randomness, and only from the ``numpy.random.Generator`` it is handed.

The pipeline order this course teaches (one defensible order, not a standard every engine follows)
is::

    hard constraints + logit bias -> penalties -> temperature -> truncation filters -> renormalise -> sample
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from servelab._validate import require_index, require_interval
from servelab.sampling.params import is_int

__all__ = [
    "MASS_TOLERANCE",
    "PROB_SUM_TOLERANCE",
    "apply_frequency_presence",
    "apply_hard_mask",
    "apply_logit_bias",
    "apply_repetition_penalty",
    "apply_temperature",
    "ban_sequences",
    "force_token",
    "greedy",
    "min_p_filter",
    "min_p_support_from_logits",
    "no_repeat_ngram_mask",
    "sample",
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

A prefix "reaches" mass ``p`` when its float sum is ``>= p - MASS_TOLERANCE``. Without it, a sum
such as ``0.35 + 0.33``, which is ``0.6799999999999999`` in binary floating point, would fail to
reach ``0.68`` and pull one more token into the kept set."""

PROB_SUM_TOLERANCE = 1e-6
"""How far from 1 the sum of a probability vector handed to a filter may drift before it is
rejected."""

FloatVector = Sequence[float] | np.ndarray


# --------------------------------------------------------------------------------------------------
# Argument checks shared by every public function
# --------------------------------------------------------------------------------------------------


def _check_logits(logits: FloatVector, name: str = "logits") -> np.ndarray:
    """Copy ``logits`` into a float64 vector; reject NaN, +inf, empty and fully masked input."""
    try:
        z = np.array(logits, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D sequence of real numbers") from exc
    if z.ndim != 1:
        raise ValueError(
            f"{name} must be 1-D (one score per vocabulary entry), got shape {z.shape}"
        )
    if z.size == 0:
        raise ValueError(f"{name} must contain at least one token, got an empty vector")
    if np.isnan(z).any() or np.isposinf(z).any():
        raise ValueError(
            f"{name} must be finite or -inf (a masked token); NaN and +inf are not allowed"
        )
    if not np.isfinite(z).any():
        raise ValueError(f"{name} has every token masked (-inf); at least one must be finite")
    return z


def _check_probs(probs: FloatVector, name: str = "probs") -> np.ndarray:
    """Copy ``probs`` into a float64 vector that is non-negative and sums to 1 (within
    tolerance)."""
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
        if not is_int(token):
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
    """Length of the shortest prefix of ``masses`` whose sum reaches ``threshold`` (see
    MASS_TOLERANCE)."""
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
    """Divide logits by a strictly positive temperature ``T`` (dimensionless); ``-inf`` stays
    ``-inf``.

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
    """Temperature applied to probabilities instead of logits: ``q_i = p_i^(1/T) / sum_j
    p_j^(1/T)``.

    For ``p = softmax(z)`` this equals ``softmax(z / T)``, because ``p_i^(1/T)`` is ``e^(z_i/T)`` up
    to a factor common to every token. (Dividing probabilities by ``T`` instead changes nothing: the
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

    The token that crosses the threshold is kept, so the kept mass can exceed ``p``. ``p`` must lie
    in ``(0, 1]``; ``p = 1`` keeps the whole support. Reaching is tested with
    :data:`MASS_TOLERANCE`.
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
    """The min-p support of ``softmax(z / T)`` computed in logit space: ``z_i >= z_max + T log
    alpha``.

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
    average go first, so the most probable token can be excluded. ``mass`` in ``(0, 1]``; ``1``
    keeps the whole support. Ties in the distance are broken by the smaller token id.
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
    """How many times each vocabulary entry occurs in ``token_ids``: an int64 vector of
    ``vocab_size``."""
    size = require_index("vocab_size", vocab_size, 1)
    ids = _check_token_ids(token_ids, size, "token_ids")
    return np.bincount(np.asarray(ids, dtype=np.int64), minlength=size)


def apply_frequency_presence(logits: FloatVector, counts: FloatVector, frequency: float,
                             presence: float) -> np.ndarray:
    """``z_i' = z_i - frequency * c_i - presence * [c_i > 0]`` (OpenAI-style additive penalties).

    ``counts`` holds one non-negative occurrence count per vocabulary entry (see
    :func:`token_counts`). The frequency term grows with every repetition; the presence term is paid
    once. Both coefficients must be finite (negative values reward repetition);
    :class:`SamplingParams` narrows them to ``[-2, 2]``. Which tokens are counted is the caller's
    choice; the pipeline counts generated tokens only.
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


def apply_repetition_penalty(
    logits: FloatVector, seen_ids: Iterable[int], penalty: float
) -> np.ndarray:
    """Sign-aware multiplicative penalty (CTRL / Hugging Face style) on every token in ``seen_ids``.

    A positive logit is divided by ``penalty`` and a negative one multiplied by it, so with
    ``penalty > 1`` both move down (``-2`` becomes ``-2.4`` at 1.2, not ``-1.667``). Zero and
    ``-inf`` are unchanged. ``penalty`` must be finite and ``> 0``; ``1`` is a no-op and values
    below 1 reward repetition. Each seen token is penalised once, however often it occurred.
    """
    z = _check_logits(logits)
    r = require_interval("penalty", penalty, 0.0, math.inf, low_open=True, high_open=True)
    seen = np.unique(np.asarray(_check_token_ids(seen_ids, z.size, "seen_ids"), dtype=np.int64))
    picked = z[seen]
    z[seen] = np.where(picked > 0, picked / r, picked * r)
    return z


def apply_logit_bias(
    logits: FloatVector, bias: Mapping[int, float] | Iterable[tuple[int, float]]
) -> np.ndarray:
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
    """Set every logit outside ``allowed_ids`` to ``-inf`` (the primitive behind grammar/JSON
    decoding).

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

    The last ``n - 1`` generated tokens form the context; wherever that context occurred earlier,
    the token that followed it is masked. ``n`` is an int >= 1 (``n = 1`` bans every token seen so
    far).
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
    probability exceeds ``u`` is returned. Exactly one draw happens on every call, even when a
    single token survives, so the generator's stream advances the same way whatever the distribution
    (a batched torch sampler that draws one uniform per row reproduces the same choices).
    """
    p = _check_probs(probs)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    u = rng.random()
    cumulative = np.cumsum(p)
    index = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    last_eligible = int(np.flatnonzero(p > 0)[-1])
    return min(index, last_eligible)  # guards the float edge where u * total rounds up to the total
