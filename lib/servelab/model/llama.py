"""A Llama-architecture decoder in plain PyTorch, with Hugging Face parameter names.

RMSNorm, rotary position embeddings (RoPE), grouped-query attention (fewer KV heads than query heads)
and a SwiGLU MLP: the same blocks as Llama 2/3 and SmolLM2. Parameter names follow the Hugging Face
layout (``model.layers.0.self_attn.q_proj.weight`` ...), so a checkpoint saved from this module loads in
``transformers.LlamaForCausalLM`` unchanged, and Llama-family checkpoints load here.

System boundary: this module computes hidden states and logits for a set of token positions. It does
not own a KV cache. Attention is delegated to an *attention backend*, a callable
``backend(layer, q, k, v) -> out`` that sees one layer's projected, rotated queries, keys and values:

* :class:`DenseCausalAttention` (here) treats the leading dims as ``[batch, seq]`` and attends
  causally within each row: training and the full-recompute reference loop use it;
* the engine's paged backend (``servelab.engine.attention``) treats the leading dim as a flat list of
  tokens from many sequences, writes K/V into the paged block pool and reads history through block tables.

Shapes: ``q`` is ``[*lead, n_heads, head_dim]``, ``k`` and ``v`` are ``[*lead, n_kv_heads, head_dim]``,
the backend returns ``[*lead, n_heads, head_dim]``. All linear layers act on the last dimension, so the
model itself is indifferent to the leading dims.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaConfig:
    """The subset of a Hugging Face ``config.json`` that a Llama forward pass needs."""

    vocab_size: int = 2048
    hidden_size: int = 192
    intermediate_size: int = 512
    num_hidden_layers: int = 4
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    bos_token_id: int = 0
    eos_token_id: int = 0
    head_dim: int | None = None
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @classmethod
    def from_hf_dict(cls, cfg: dict) -> "LlamaConfig":
        """Build from a parsed HF ``config.json``; unknown keys are kept in ``extra``."""
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        kwargs = {k: cfg[k] for k in known if k in cfg and cfg[k] is not None}
        eos = kwargs.get("eos_token_id")
        if isinstance(eos, list):  # some checkpoints list several EOS ids; the first is the canonical one
            kwargs["eos_token_id"] = eos[0]
        return cls(**kwargs, extra={k: v for k, v in cfg.items() if k not in known})

    def to_hf_dict(self) -> dict:
        """The HF ``config.json`` content for this configuration."""
        cfg = {k: v for k, v in asdict(self).items() if k != "extra"}
        cfg.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                    "torch_dtype": "float32"})
        return cfg


class AttentionBackend(Protocol):
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class DenseCausalAttention:
    """Causal attention over ``[batch, seq]`` rows, with no cache: every position sees its prefix."""

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.transpose(-3, -2) for t in (q, k, v))  # [B, heads, S, d]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(-3, -2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``weight * x / sqrt(mean(x^2) + eps)``, normalised in float32 (as Hugging Face does) by one
        fused kernel; the gain multiplies after the cast back to ``x``'s dtype."""
        normed = F.rms_norm(x.float(), self.weight.shape, eps=self.eps)
        return self.weight * normed.to(x.dtype)


@functools.lru_cache(maxsize=8)
def rope_inv_freq(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """RoPE's inverse frequencies ``theta ** (-2i / head_dim)``, float32 ``[head_dim / 2]``: computed once
    per (head_dim, theta, device), not in every forward pass. Callers must not modify the result."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for the given absolute positions, shaped ``[*positions.shape, 1, head_dim]``.

    Angles are computed in float32 (position times inverse frequency) and only then cast to ``dtype``.
    """
    angles = positions.float()[..., None] * rope_inv_freq(head_dim, theta, positions.device)  # [*pos, d/2]
    emb = torch.cat((angles, angles), dim=-1)[..., None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of the last dim: the HF "rotate_half" convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.layer, self.n_heads, self.n_kv, self.d = (
            layer, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                backend: AttentionBackend) -> torch.Tensor:
        lead = x.shape[:-1]
        q = apply_rope(self.q_proj(x).view(*lead, self.n_heads, self.d), cos, sin)
        k = apply_rope(self.k_proj(x).view(*lead, self.n_kv, self.d), cos, sin)
        v = self.v_proj(x).view(*lead, self.n_kv, self.d)
        out = backend(self.layer, q, k, v)
        return self.o_proj(out.reshape(*lead, self.n_heads * self.d))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                backend: AttentionBackend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Token ids in, next-token logits out. See the module docstring for the backend contract."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor,
                      backend: AttentionBackend) -> torch.Tensor:
        """Final-norm hidden states, ``[*input_ids.shape, hidden_size]``."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, backend)
        return self.model.norm(x)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                backend: AttentionBackend | None = None) -> torch.Tensor:
        """Logits ``[*input_ids.shape, vocab_size]``. Defaults: positions 0..S-1, dense causal attention."""
        if positions is None:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
        backend = backend if backend is not None else DenseCausalAttention()
        return self.lm_head(self.hidden_states(input_ids, positions, backend))
