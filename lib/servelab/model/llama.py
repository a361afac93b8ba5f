"""A Llama-architecture decoder in plain PyTorch, with Hugging Face parameter names.

RMSNorm, rotary position embeddings (RoPE), grouped-query attention (fewer KV heads than query
heads) and a SwiGLU MLP: the same blocks as Llama 2/3 and SmolLM2.

A *family* is a few named differences of this one model, each a :class:`LlamaConfig` field read in
one place (:mod:`servelab.model.families` maps a ``config.json`` onto them):

* ``qkv_bias`` (Qwen2/2.5): the q, k and v projections have biases (:class:`LlamaAttention`);
* ``qk_norm`` (Qwen3): an RMSNorm over each query and key head before RoPE
  (:class:`LlamaAttention`);
* ``rope_scaling`` (Llama 3.x ``llama3``, ``linear``): RoPE's frequencies rescaled
 (:func:`rope_inv_freq`). Parameter names follow the Hugging Face
layout (``model.layers.0.self_attn.o_proj.weight`` ...), with one difference that serving engines
make
too: the q, k and v projections are *packed* into one matrix (``qkv_proj``), and so are the gate and
up projections (``gate_up_proj``), so one matmul does the work of three (or two).
:data:`PACKED_PROJECTIONS`, :func:`pack_hf_state` and :func:`unpack_to_hf_state` translate, so
checkpoints keep Hugging Face's separate tensors: one saved from this module loads in
``transformers.LlamaForCausalLM`` unchanged, and Llama-family checkpoints load here.

System boundary: this module computes hidden states and logits for a set of token positions. It does
not own a KV cache. Attention is delegated to an *attention backend*, a callable ``backend(layer, q,
k, v) -> out`` that sees one layer's projected, rotated queries, keys and values:

* :class:`DenseCausalAttention` (here) treats the leading dims as ``[batch, seq]`` and attends
  causally within each row: training and the full-recompute reference loop use it;
* the engine's paged backend (``servelab.engine.model_runner``) treats the leading dim as a flat
  list of tokens from many sequences, writes K/V into the paged block pool and reads history through
  block tables.

Shapes: ``q`` is ``[*lead, n_heads, head_dim]``, ``k`` and ``v`` are ``[*lead, n_kv_heads,
head_dim]``, the backend returns ``[*lead, n_heads, head_dim]``. All linear layers act on the last
dimension, so the model itself is indifferent to the leading dims.
"""

from __future__ import annotations

import functools
import math
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
    # a list: every id ends a sequence (Llama 3 Instruct has three)
    eos_token_id: int | list[int] = 0
    head_dim: int | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    # {"rope_type": "llama3" | "linear", "factor": ..., ...}; None: plain
    rope_scaling: dict | None = None
    model_type: str = "llama"
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
            "head_dim",
        ):
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
        return cls(**kwargs, extra={k: v for k, v in cfg.items() if k not in known})

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends a sequence."""
        eos = self.eos_token_id
        return tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)

    def to_hf_dict(self) -> dict:
        """The HF ``config.json`` content for this (plain Llama) configuration."""
        if self.qkv_bias or self.qk_norm or self.rope_scaling or self.model_type != "llama":
            raise ValueError(
                f"to_hf_dict writes plain Llama configs only, not a {self.model_type!r} one"
            )
        cfg = {k: v for k, v in asdict(self).items()
               if k not in ("extra", "qkv_bias", "qk_norm", "rope_scaling")}
        cfg.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                    "torch_dtype": "float32"})
        return cfg


class AttentionBackend(Protocol):
    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...


class DenseCausalAttention:
    """Causal attention over ``[batch, seq]`` rows, with no cache: every position sees its
    prefix."""

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        q, k, v = (t.transpose(-3, -2) for t in (q, k, v))  # [B, heads, S, d]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(-3, -2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``weight * x / sqrt(mean(x^2) + eps)``. Like Hugging Face, a low-precision ``x`` is
        normalised in float32 and the gain multiplies after the cast back; in float32 that is one
        ``rms_norm`` call."""
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)


@functools.lru_cache(maxsize=8)
def rope_inv_freq(head_dim: int, theta: float, device: torch.device,
                  scaling: tuple[tuple[str, object], ...] = ()) -> torch.Tensor:
    """RoPE's inverse frequencies ``theta ** (-2i / head_dim)``, float32 ``[head_dim / 2]``:
    computed once per (head_dim, theta, device, scaling), not in every forward pass. Callers must
    not modify the result.

    ``scaling`` is ``rope_scaling``'s items: ``linear`` divides every frequency by ``factor``
    (positions stretched); ``llama3`` divides only the low frequencies (wavelengths over
    ``original_max_position_embeddings / low_freq_factor``) and blends smoothly up to the high ones
    (wavelengths under ``... / high_freq_factor``, kept), as transformers'
    ``_compute_llama3_parameters``."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    params = dict(scaling)
    kind = params.get("rope_type", "default")
    if kind == "linear":
        return inv_freq / params["factor"]
    if kind == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old_context = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


def rope_key(scaling: dict | None) -> tuple[tuple[str, object], ...]:
    """``rope_scaling`` as the hashable key :func:`rope_inv_freq` caches on."""
    return tuple(sorted((scaling or {}).items()))


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                 scaling: tuple[tuple[str, object], ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables ``(cos, signed_sin)`` for the given absolute positions, ``[*positions.shape, 1,
    head_dim]``.

    Angles are computed in float32 (position times inverse frequency) and only then cast to
    ``dtype``. ``signed_sin`` is ``(-sin, +sin)`` over the two halves of the head: the sign of the
    "rotate_half" convention, folded in once per forward pass instead of once per layer (see
    :func:`apply_rope`).
    """
    # [*pos, d/2]
    angles = positions.float()[..., None] * rope_inv_freq(
        head_dim, theta, positions.device, scaling
    )
    sin = angles.sin()
    cos = angles.cos()
    return (torch.cat((cos, cos), dim=-1)[..., None, :].to(dtype),
            torch.cat((-sin, sin), dim=-1)[..., None, :].to(dtype))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (i, i + d/2) of the last dim by each position's angles (the HF "rotate_half"
    convention): ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = (-x2, x1)``, computed as
    ``x * cos + (x2, x1) * signed_sin``; rolling the last dim by half a head swaps the halves."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


class LlamaAttention(nn.Module):
    """Projections, RoPE and the output projection around the attention backend.

    ``qkv_proj`` is HF's ``q_proj``, ``k_proj`` and ``v_proj`` stacked along the output dim: its
    output is ``n_heads`` query heads, then ``n_kv`` key heads, then ``n_kv`` value heads, so RoPE
    rotates the query and key heads in one call. Family differences: ``qkv_bias`` gives the packed
    projection a bias (Qwen2); ``qk_norm`` adds ``q_norm`` / ``k_norm``, RMSNorms over ``head_dim``
    applied to every query and key head before RoPE (Qwen3).
    """

    def __init__(self, cfg: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.layer, self.n_heads, self.n_kv, self.d = (
            layer, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, (self.n_heads + 2 * self.n_kv) * self.d, bias=cfg.qkv_bias
        )
        self.o_proj = nn.Linear(self.n_heads * self.d, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                backend: AttentionBackend) -> torch.Tensor:
        lead = x.shape[:-1]
        qkv = self.qkv_proj(x).view(*lead, self.n_heads + 2 * self.n_kv, self.d)
        qk, v = qkv.split([self.n_heads + self.n_kv, self.n_kv], dim=-2)
        if hasattr(self, "q_norm"):
            q, k = qk.split([self.n_heads, self.n_kv], dim=-2)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), dim=-2)
        q, k = apply_rope(qk, cos, sin).split([self.n_heads, self.n_kv], dim=-2)
        out = backend(self.layer, q, k, v)
        return self.o_proj(out.reshape(*lead, self.n_heads * self.d))


class LlamaMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``; ``gate_up_proj`` is HF's gate and up projections
    stacked."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


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


PACKED_PROJECTIONS: dict[str, tuple[str, ...]] = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
"""Each packed projection of a decoder layer and the Hugging Face projections stacked in it, in
order."""
_PARAM_KINDS = ("weight", "bias")


def _part_sizes(cfg: LlamaConfig) -> dict[str, list[int]]:
    """Output rows of each part of each packed projection."""
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    return {"self_attn.qkv_proj": [q, kv, kv], "mlp.gate_up_proj": [cfg.intermediate_size] * 2}


def unpack_to_hf_state(state: dict[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """This module's state dict under Hugging Face names: every packed matrix split back into its
    parts.

    Order is kept (the parts take the packed matrix's place) and the parts are views of it, not
    copies.
    """
    sizes = _part_sizes(cfg)
    hf: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        packed = next(
            (
                p
                for p in PACKED_PROJECTIONS
                for kind in _PARAM_KINDS
                if name.endswith(f".{p}.{kind}")
            ),
            None,
        )
        if packed is None:
            hf[name] = tensor
            continue
        prefix, kind = (
            name[: -len(f"{packed}.") - len(name.rpartition(".")[2])],
            name.rpartition(".")[2],
        )
        for part, rows in zip(PACKED_PROJECTIONS[packed], tensor.split(sizes[packed])):
            hf[f"{prefix}{part}.{kind}"] = rows
    return hf


def pack_hf_state(state: dict[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """A Hugging Face state dict under this module's names: each layer's parts concatenated into the
    packed matrix. Validate the HF dict first
    (:func:`servelab.model.checkpoint.check_state_dict`)."""
    packed_state = dict(state)
    for layer in range(cfg.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        for packed, parts in PACKED_PROJECTIONS.items():
            for kind in _PARAM_KINDS:
                names = [f"{prefix}{part}.{kind}" for part in parts]
                if names[0] in packed_state:
                    packed_state[f"{prefix}{packed}.{kind}"] = torch.cat(
                        [packed_state.pop(n) for n in names]
                    )
    return packed_state


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
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype,
                                rope_key(self.config.rope_scaling))
        for layer in self.model.layers:
            x = layer(x, cos, sin, backend)
        return self.model.norm(x)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                backend: AttentionBackend | None = None) -> torch.Tensor:
        """Logits ``[*input_ids.shape, vocab_size]``, on the model's device. Defaults: positions
        0..S-1, dense causal attention. Ids and positions built elsewhere (say on the CPU) are moved
        to the model."""
        input_ids = input_ids.to(self.lm_head.weight.device)
        if positions is None:
            positions = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(
                input_ids
            )
        positions = positions.to(input_ids.device)
        backend = backend if backend is not None else DenseCausalAttention()
        return self.lm_head(self.hidden_states(input_ids, positions, backend))
