"""Mixture-of-experts arithmetic: total versus active parameters, and how many experts a batch
touches.

A MoE layer replaces the one MLP with ``n_experts`` expert MLPs and a router that sends each token
to ``top_k`` of them. Memory holds **every** expert (the total parameters); one token's compute
touches only its ``top_k`` experts plus the dense parts (the active parameters, about 2 FLOPs each).
What a decode step *reads* lies in between and grows with the batch:
:func:`expected_distinct_experts` is the number of experts per layer that ``tokens`` tokens hit when
routing is uniform and independent.

Two published configurations are included (:data:`MIXTRAL_8X7B`, :data:`QWEN3_30B_A3B`, from their
``config.json``); :func:`moe_param_counts` reproduces their published totals (46.7B/12.9B and
30.5B/3.3B). Counted: attention projections, expert MLPs (gate, up, down), routers, embeddings and
the LM head; norm weights are left out (under 0.01 % of either model). Units: parameters (a count).
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab._validate import require_index, require_real

__all__ = ["MIXTRAL_8X7B", "QWEN3_30B_A3B", "MoEConfig", "MoEParams", "expected_distinct_experts",
           "moe_param_counts"]


@dataclass(frozen=True)
class MoEConfig:
    """The shape of a decoder whose every layer is attention plus a MoE MLP (SwiGLU experts)."""

    name: str
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    d_head: int
    d_expert: int
    n_experts: int
    top_k: int
    vocab: int
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        for field in ("n_layer", "d_model", "n_head", "n_kv_head", "d_head", "d_expert",
                      "n_experts", "top_k", "vocab"):
            require_index(field, getattr(self, field), 1)
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k must be at most n_experts={self.n_experts}, got {self.top_k}")


MIXTRAL_8X7B = MoEConfig("Mixtral-8x7B", n_layer=32, d_model=4096, n_head=32, n_kv_head=8,
                         d_head=128, d_expert=14336, n_experts=8, top_k=2, vocab=32000)
QWEN3_30B_A3B = MoEConfig("Qwen3-30B-A3B", n_layer=48, d_model=2048, n_head=32, n_kv_head=4,
                          d_head=128, d_expert=768, n_experts=128, top_k=8, vocab=151936)


@dataclass(frozen=True)
class MoEParams:
    """Parameter counts: ``total`` held in memory, ``active`` touched by one token."""

    total: int
    active: int
    expert: int
    """Parameters of one expert MLP in one layer."""


def moe_param_counts(config: MoEConfig) -> MoEParams:
    """Total and active parameters of ``config`` (see the module docstring for what is counted).

    >>> p = moe_param_counts(MIXTRAL_8X7B)
    >>> round(p.total / 1e9, 1), round(p.active / 1e9, 1)
    (46.7, 12.9)
    """
    if not isinstance(config, MoEConfig):
        raise ValueError(f"config must be a MoEConfig, got {type(config).__name__}")
    c = config
    attention = c.d_model * c.d_head * (2 * c.n_head + 2 * c.n_kv_head)  # q, o and k, v projections
    expert = 3 * c.d_model * c.d_expert                                   # gate, up, down
    router = c.d_model * c.n_experts
    embeddings = c.vocab * c.d_model * (1 if c.tied_embeddings else 2)
    total = c.n_layer * (attention + router + c.n_experts * expert) + embeddings
    active = c.n_layer * (attention + router + c.top_k * expert) + embeddings
    return MoEParams(total=total, active=active, expert=expert)


def expected_distinct_experts(n_experts: int, top_k: int, tokens: int) -> float:
    """Expected number of a layer's experts that ``tokens`` tokens hit, each choosing ``top_k`` of
    ``n_experts`` uniformly and independently:
    ``n_experts * (1 - (1 - top_k / n_experts) ** tokens)``.

    Real routers are not uniform (hot experts), so this is a model, not a measurement; it shows how
    fast a decode batch ends up reading every expert's weights.

    >>> expected_distinct_experts(8, 2, 1)
    2.0
    """
    n = require_index("n_experts", n_experts, 1)
    k = require_index("top_k", top_k, 1, n)
    t = require_index("tokens", tokens, 0)
    miss = require_real("top_k / n_experts", 1 - k / n, 0, 1)
    return n * (1 - miss ** t)
