"""What a drafter costs and what its acceptance length buys: a draft model against a draft head.

Speculative decoding drafts ``k`` tokens cheaply and verifies them in one target forward pass.
Two kinds of drafter:

* a **draft model**: a separate, smaller model of the same tokenizer, with its own KV cache, run
  ``k`` times per cycle on the tokens alone;
* a **draft head** (EAGLE, Medusa, a model's own multi-token-prediction (MTP) layer): a layer or two
  trained on top of the *target's* hidden states, so it reuses the features the target already
  computed, has almost no weights to read, and (EAGLE, MTP) predicts well because it sees them.

A cycle costs ``verify + k x draft_cost`` (in target forward passes) and advances the **mean
acceptance length** ``tau = (1 - a^(k+1)) / (1 - a)`` tokens for i.i.d. per-token acceptance ``a``
(:func:`servelab.metrics.capacity.expected_tokens_per_cycle`; engines report ``tau`` as "mean
acceptance length"). At small batch, where a verify pass costs about one decode step, the speed-up
over plain decoding is ``tau / (verify + k x draft_cost)``.

System boundary: cost ratios stated by the caller (no timing), one sequence, i.i.d. acceptance.
"""

from __future__ import annotations

from servelab._validate import require_int, require_real
from servelab.metrics.capacity import expected_tokens_per_cycle

__all__ = ["acceptance_rate_for_length", "cycle_cost", "speedup_over_decode"]


def cycle_cost(draft_len: int, draft_cost: float, verify_cost: float = 1.0) -> float:
    """One cycle's cost in target decode steps: ``verify_cost + draft_len x draft_cost``."""
    k = require_int("draft_len", draft_len, 0)
    c = require_real("draft_cost", draft_cost, 0)
    v = require_real("verify_cost", verify_cost, 0, strict_min=True)
    return v + k * c


def speedup_over_decode(acceptance_rate: float, draft_len: int, draft_cost: float,
                        verify_cost: float = 1.0) -> float:
    """Tokens per target-step equivalent: mean acceptance length over the cycle's cost
    (above 1 speculation pays)."""
    tau = expected_tokens_per_cycle(acceptance_rate, draft_len)
    return tau / cycle_cost(draft_len, draft_cost, verify_cost)


def acceptance_rate_for_length(mean_length: float, draft_len: int, tol: float = 1e-10) -> float:
    """The i.i.d. acceptance rate ``a`` whose mean acceptance length at ``draft_len`` drafted
    tokens is ``mean_length`` (between 1 and ``draft_len + 1``), by bisection."""
    k = require_int("draft_len", draft_len, 1)
    tau = require_real("mean_length", mean_length, 1, k + 1)
    low, high = 0.0, 1.0
    while high - low > tol:
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens_per_cycle(mid, k) < tau else (low, mid)
    return (low + high) / 2
