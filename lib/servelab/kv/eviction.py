"""Evicting the oldest tokens' KV: what a decode step sees once they are gone.

A cache that drops the K/V of the first ``dropped`` positions and carries on is not a smaller exact
cache: every later query of a full-attention model was trained to see those positions. This module
reproduces the eviction on the dense model without a paged pool: :class:`EvictedPrefixAttention` is
causal attention in which queries at position ``first_query`` and later cannot see keys
``0 .. dropped - 1``, in every layer. Positions before ``first_query`` (the prompt, prefilled while
the old tokens were still cached) keep their full view, so their K/V is what the cache held.

System boundary: one sequence of token ids in, logits or greedy token ids out, by full recompute at
every step (so nothing but the mask differs from the model's own dense attention). No sampling, no
batching, no engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from servelab._validate import require_int
from servelab.model.llama import LlamaForCausalLM

__all__ = ["EvictedPrefixAttention", "evicted_logits", "evicted_greedy", "first_difference"]


class EvictedPrefixAttention:
    """Causal attention where queries at ``first_query`` and later cannot see the first ``dropped``
    keys.

    Called by every decoder layer with ``q`` ``[batch, seq, heads, d]`` and ``k``, ``v``
    ``[batch, seq, kv_heads, d]`` (grouped-query attention); returns ``[batch, seq, heads, d]``.
    """

    def __init__(self, dropped: int, first_query: int) -> None:
        self.dropped = require_int("dropped", dropped, minimum=0)
        self.first_query = require_int("first_query", first_query, minimum=0)

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        q, k, v = (t.transpose(-3, -2) for t in (q, k, v))  # [batch, heads, seq, d]
        n = q.shape[-2]
        if self.first_query < n and self.dropped > self.first_query:
            raise ValueError(
                f"dropped must be <= first_query = {self.first_query} (a query must see itself), "
                f"got {self.dropped}"
            )
        allowed = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        allowed[self.first_query:, :self.dropped] = False
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
        return out.transpose(-3, -2)


def _ids(model: LlamaForCausalLM, prompt_ids: Sequence[int]) -> list[int]:
    if not isinstance(model, LlamaForCausalLM):
        raise TypeError(f"model must be a LlamaForCausalLM, got {type(model).__name__}")
    ids = [int(t) for t in prompt_ids]
    if len(ids) < 2 or not all(0 <= t < model.config.vocab_size for t in ids):
        raise ValueError(
            f"prompt_ids must hold >= 2 token ids in [0, {model.config.vocab_size - 1}]"
        )
    return ids


@torch.inference_mode()
def evicted_logits(
    model: LlamaForCausalLM, ids: Sequence[int], dropped: int, first_query: int
) -> torch.Tensor:
    """Float32 next-token logits ``[vocab]`` after ``ids`` when queries from ``first_query`` on
    cannot see the first ``dropped`` positions."""
    device = model.lm_head.weight.device
    x = torch.tensor([list(ids)], device=device)
    positions = torch.arange(x.shape[1], device=device)[None]
    hidden = model.hidden_states(x, positions, EvictedPrefixAttention(dropped, first_query))
    return model.lm_head(hidden[0, -1]).float()


def evicted_greedy(model: LlamaForCausalLM, prompt_ids: Sequence[int], dropped: int,
                   max_new_tokens: int) -> list[int]:
    """Greedy continuation of ``prompt_ids`` after the KV of its first ``dropped`` tokens was
    evicted.

    The prompt's last token is the first query that runs after the eviction; every generated token
    is a later query, so none of them sees the dropped positions. ``dropped=0`` is plain greedy
    decoding. Returns the ``max_new_tokens`` generated ids (no stop token).
    """
    ids = _ids(model, prompt_ids)
    require_int("dropped", dropped, minimum=0, maximum=len(ids) - 1)
    require_int("max_new_tokens", max_new_tokens, minimum=1)
    first_query = len(ids) - 1
    for _ in range(max_new_tokens):
        ids.append(int(evicted_logits(model, ids, dropped, first_query).argmax()))
    return ids[first_query + 1:]


def first_difference(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first position where two token sequences differ (``None`` if they agree where
    both have tokens)."""
    return next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), None)
