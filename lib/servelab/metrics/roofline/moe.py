"""Mixture-of-experts arithmetic: total vs active parameters in the weight, KV and FLOP budgets.

A mixture-of-experts (MoE) decoder replaces each MLP with ``n_experts`` small expert MLPs and a
router that sends each token to ``top_k`` of them. Memory holds *every* expert (total parameters);
one token's matmuls touch only its ``top_k`` experts (active parameters). The KV cache depends on
attention alone, so it is the same as a dense model with that attention. A decode step of a batch
reads the weights of every expert *any* of its tokens chose, which grows from the active set at
batch 1 towards the total as the batch grows (:func:`experts_touched`).

:data:`QWEN3_30B_A3B` and :data:`MIXTRAL_8X7B` hold the shape fields of the published
``config.json`` files; the counts reproduce the published totals (30.5B / 3.3B and 46.7B / 12.9B).
Counted: attention projections, expert MLPs (gate, up, down), routers, embeddings and the LM head;
norm weights are left out (under 0.01 % of the parameters).
Units: parameters, bytes, FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab._validate import require_int
from servelab.kv import kv_bytes_per_token

__all__ = ["MIXTRAL_8X7B", "MoEShape", "QWEN3_30B_A3B", "experts_touched"]


@dataclass(frozen=True)
class MoEShape:
    """A decoder whose every layer has attention, a router and ``n_experts`` SwiGLU experts
    (gate, up and down projections of width ``expert_ffn``), of which each token uses ``top_k``."""

    name: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_experts: int
    top_k: int
    expert_ffn: int
    vocab_size: int
    tied_embeddings: bool = False
    bytes_per_elem: int = 2

    def __post_init__(self) -> None:
        for name in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "n_experts",
                     "top_k", "expert_ffn", "vocab_size", "bytes_per_elem"):
            require_int(name, getattr(self, name), 1)
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k must be <= n_experts ({self.n_experts}), got {self.top_k}")

    @property
    def attention_params(self) -> int:
        """Q, K, V and output projections of one layer."""
        q = self.n_heads * self.head_dim
        kv = self.n_kv_heads * self.head_dim
        return self.hidden_size * (2 * q + 2 * kv)

    @property
    def expert_params(self) -> int:
        """One expert: gate, up and down projections."""
        return 3 * self.hidden_size * self.expert_ffn

    @property
    def router_params(self) -> int:
        return self.hidden_size * self.n_experts

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    def _params(self, experts: float) -> float:
        per_layer = self.attention_params + self.router_params + experts * self.expert_params
        return self.n_layers * per_layer + self.embedding_params

    @property
    def total_params(self) -> int:
        """Every weight the model stores: what memory must hold."""
        return int(self._params(self.n_experts))

    @property
    def active_params(self) -> int:
        """The weights one token uses: attention, router, ``top_k`` experts, embeddings."""
        return int(self._params(self.top_k))

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights at ``bytes_per_elem``."""
        return self.total_params * self.bytes_per_elem

    @property
    def flops_per_token(self) -> int:
        """Matmul FLOPs of one token's forward pass outside attention scores: 2 x the active
        parameters, less the input embedding (a lookup, not a matmul)."""
        return 2 * (self.active_params - self.vocab_size * self.hidden_size)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache per token: attention's shape only, the experts add nothing."""
        return kv_bytes_per_token(self.n_layers, self.n_kv_heads, self.head_dim,
                                  self.bytes_per_elem)

    def decode_weight_bytes(self, batch: int) -> float:
        """Expected weight bytes one decode step of ``batch`` tokens reads: everything but the
        experts once, plus every expert at least one token chose (:func:`experts_touched`)."""
        touched = experts_touched(self.n_experts, self.top_k, batch)
        return self._params(touched) * self.bytes_per_elem


def experts_touched(n_experts: int, top_k: int, batch: int) -> float:
    """Expected number of distinct experts of one layer chosen by ``batch`` tokens, each picking
    ``top_k`` of ``n_experts`` uniformly and independently: ``E (1 - (1 - k/E)^batch)`` (0 for an
    empty batch, ``top_k`` for one token). Real routers are skewed,
    which touches fewer experts per step but loads some of them more."""
    e = require_int("n_experts", n_experts, 1)
    k = require_int("top_k", top_k, 1, e)
    b = require_int("batch", batch, 0)
    return e * (1 - (1 - k / e) ** b)


QWEN3_30B_A3B = MoEShape(name="Qwen3-30B-A3B", n_layers=48, hidden_size=2048, n_heads=32,
                         n_kv_heads=4, head_dim=128, n_experts=128, top_k=8, expert_ffn=768,
                         vocab_size=151_936)
"""Qwen3-30B-A3B's shape from its published ``config.json``, in bf16."""

MIXTRAL_8X7B = MoEShape(
    name="Mixtral-8x7B",
    n_layers=32,
    hidden_size=4096,
    n_heads=32,
    n_kv_heads=8,
    head_dim=128,
    n_experts=8,
    top_k=2,
    expert_ffn=14336,
    vocab_size=32000,
)
"""Mixtral-8x7B's shape from its published ``config.json``, in bf16."""
