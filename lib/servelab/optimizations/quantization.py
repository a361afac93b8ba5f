"""Weight-only int8 quantization of the Llama projections, and KV-cache quantization as a capacity
question.

Two separate design points, kept apart on purpose (they are often conflated):

*Weights.* Every projection of the decoder (the packed ``qkv_proj`` and ``gate_up_proj``,
``o_proj``, ``down_proj``) gets an int8 weight and one float32 scale per output channel (per row of
the ``[out, in]`` weight), chosen symmetrically so that the row's largest absolute value maps to
127. :class:`Int8Linear` keeps only those two tensors and computes ``y = (x @ W_q^T) * scale``: the
int8 weight is converted to the activation dtype on the fly and the per-row scale is applied to the
output, which equals multiplying the dequantized weight because each scale belongs to exactly one
output channel. Activations stay in floating point (weight-only, "W8A16"/"W8A32"). The embedding
table and the LM head tied to it are not quantized: they are kept in the model's dtype, and
:func:`model_weight_bytes` counts them.

*KV cache.* Quantizing the cache changes how many tokens fit, not how many bytes the weights take.
:func:`kv_capacity` compares cache formats for one memory budget using the one KV formula the course
has (``servelab.kv.kv_bytes_per_token``); a per-group scale is charged with the same formula.

System boundary: a ``LlamaForCausalLM`` in, the same object with its projections swapped out; bytes
are the stored tensor payload (``numel * element_size``), excluding allocator padding and
workspaces. Nothing here measures accuracy or speed; the chapter notebook does, on the shipped
model.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from servelab.kv import kv_bytes_per_token
from servelab.model.llama import LlamaForCausalLM

__all__ = [
    "INT8_MAX",
    "KV_FORMATS",
    "PROJECTION_NAMES",
    "Int8Linear",
    "KVCapacity",
    "KVFormat",
    "dequantize_int8",
    "kv_capacity",
    "model_weight_bytes",
    "quantize_model",
    "quantize_model_dynamic",
    "quantize_per_channel_int8",
]

INT8_MAX = 127
"""Symmetric int8 range is [-127, 127]; -128 is left unused so that +x and -x round
symmetrically."""

PROJECTION_NAMES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
"""The ``nn.Linear`` attributes of a Llama decoder layer that :func:`quantize_model` replaces."""


# --------------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------------


def quantize_per_channel_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 quantization of a ``[out_features, in_features]`` weight.

    Returns ``(q, scale)``: int8 ``q`` of the same shape and float32 ``scale`` of shape ``[out]``
    with ``weight ~= q * scale[:, None]``. Row ``i``'s scale is ``max|weight[i]| / 127``; an
    all-zero row gets scale 1 (its codes are all 0, so any positive scale reproduces it exactly).
    The rounding error of every element is at most ``scale / 2``.
    """
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise TypeError(
            f"weight must be a floating-point torch.Tensor, got {type(weight).__name__}"
        )
    if weight.dim() != 2:
        raise ValueError(
            f"weight must be 2-D [out_features, in_features], got shape {tuple(weight.shape)}"
        )
    if not torch.isfinite(weight).all():
        raise ValueError("weight must be finite (no NaN or inf) to be quantized")
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 weight ``q * scale[:, None]`` that an int8 weight and its per-row scales stand
    for."""
    if q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"q must be a 2-D int8 tensor, got {q.dtype} with shape {tuple(q.shape)}")
    if scale.shape != (q.shape[0],):
        raise ValueError(
            f"scale must have shape ({q.shape[0]},) (one per output channel), got "
            f"{tuple(scale.shape)}"
        )
    return q.float() * scale.float()[:, None]


class Int8Linear(nn.Module):
    """A bias-free linear layer holding an int8 weight and float32 per-output-channel scales.

    ``forward(x)`` returns ``(x @ W_q^T) * scale`` in ``x``'s dtype: the int8 codes are cast to the
    activation dtype for the matmul and the scale multiplies the ``[*, out]`` result. Both tensors
    are
    buffers (not parameters): nothing here is trained.
    """

    def __init__(self, weight_q: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        if weight_q.dtype != torch.int8 or weight_q.dim() != 2:
            raise ValueError(
                f"weight_q must be a 2-D int8 tensor, got {weight_q.dtype} {tuple(weight_q.shape)}"
            )
        if scale.shape != (weight_q.shape[0],) or not scale.is_floating_point():
            raise ValueError(f"scale must be a float tensor of shape ({weight_q.shape[0]},), got "
                             f"{scale.dtype} {tuple(scale.shape)}")
        self.out_features, self.in_features = weight_q.shape
        self.register_buffer("weight_q", weight_q)
        self.register_buffer("scale", scale.float())

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        """Quantize a bias-free ``nn.Linear`` (the Llama projections have no bias)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        if linear.bias is not None:
            raise ValueError(
                "linear must have no bias (Int8Linear quantizes bias-free projections only)"
            )
        q, scale = quantize_per_channel_int8(linear.weight)
        return cls(q.to(linear.weight.device), scale.to(linear.weight.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight_q.to(x.dtype))
        return y * self.scale.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def quantize_model(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """Replace every decoder projection of ``model`` with an :class:`Int8Linear`, in place.

    Returns the same object for chaining. Embeddings, norms and the (tied) LM head are untouched. A
    model whose projections are already int8 is rejected rather than quantized twice.
    """
    if not isinstance(model, LlamaForCausalLM):
        raise TypeError(f"model must be a LlamaForCausalLM, got {type(model).__name__}")
    for layer in model.model.layers:
        for block in (layer.self_attn, layer.mlp):
            for name in PROJECTION_NAMES:
                linear = getattr(block, name, None)
                if isinstance(linear, Int8Linear):
                    raise ValueError(f"model is already quantized ({name} is an Int8Linear)")
                if isinstance(linear, nn.Linear):
                    setattr(block, name, Int8Linear.from_linear(linear))
    return model


def quantize_model_dynamic(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """The kernel path: every decoder projection becomes PyTorch's dynamically quantized linear
    layer (``torch.ao``), in place; returns the same object.

    Unlike :class:`Int8Linear`, which converts its int8 codes back to floats on every call, this
    layer's kernel (fbgemm or oneDNN on x86 CPUs) reads the int8 weight directly: the activations
    are quantized to int8 per call (one scale per batch), multiplied in integer arithmetic and
    rescaled. Weights keep one scale per output channel, as in :func:`quantize_per_channel_int8`.
    CPU only; embeddings, norms and the tied LM head stay in floating point.
    """
    if not isinstance(model, LlamaForCausalLM):
        raise TypeError(f"model must be a LlamaForCausalLM, got {type(model).__name__}")
    names = {f"model.layers.{i}.{part}.{name}" for i, layer in enumerate(model.model.layers)
             for part in ("self_attn", "mlp") for name in PROJECTION_NAMES
             if isinstance(getattr(getattr(layer, part), name, None), nn.Linear)}
    if not names:
        raise ValueError("model has no floating-point projections left to quantize")
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    # torch.ao's eager API announces its move to torchao on every call
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            model, dict.fromkeys(names, qconfig), inplace=True
        )


def _dynamic_int8_bytes(module: nn.Module) -> tuple[int, int]:
    """(int8 weight bytes, scale bytes) of a ``torch.ao`` dynamically quantized linear layer."""
    weight = module.weight()
    scales = (
        weight.q_per_channel_scales()
        if weight.qscheme() == torch.per_channel_affine
        else torch.ones(1)
    )
    return weight.numel() * weight.element_size(), scales.numel() * scales.element_size()


def model_weight_bytes(model: nn.Module) -> dict[str, int]:
    """Stored bytes of ``model``'s weights, split by kind; shared (tied) tensors are counted once.

    Keys: ``"int8_weights"`` (int8 codes, of :class:`Int8Linear` or of
    :func:`quantize_model_dynamic`'s layers), ``"scales"`` (their float scales), ``"float_weights"``
    (every other parameter or buffer: embeddings, norms, unquantized projections) and ``"total"``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch nn.Module, got {type(model).__name__}")
    seen: set[int] = set()
    split = {"int8_weights": 0, "scales": 0, "float_weights": 0}
    for module in model.modules():
        if isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            weights, scales = _dynamic_int8_bytes(module)
            split["int8_weights"] += weights
            split["scales"] += scales
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for name, tensor in tensors:
            if tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            size = tensor.numel() * tensor.element_size()
            if isinstance(module, Int8Linear):
                split["int8_weights" if name == "weight_q" else "scales"] += size
            else:
                split["float_weights"] += size
    split["total"] = sum(split.values())
    return split


# --------------------------------------------------------------------------------------------------
# KV cache: a capacity trade-off
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVFormat:
    """How one KV element is stored: ``bytes_per_elem`` bytes, plus one scale of ``scale_bytes``
    bytes per ``scale_group`` consecutive elements of a head vector (``scale_group=None``: one scale
    for the whole tensor, negligible per token)."""

    name: str
    bytes_per_elem: int
    scale_bytes: int = 0
    scale_group: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.bytes_per_elem, int) or self.bytes_per_elem < 1:
            raise ValueError(f"bytes_per_elem must be an int >= 1, got {self.bytes_per_elem!r}")
        if not isinstance(self.scale_bytes, int) or self.scale_bytes < 0:
            raise ValueError(f"scale_bytes must be an int >= 0, got {self.scale_bytes!r}")
        if self.scale_group is not None and (
            not isinstance(self.scale_group, int) or self.scale_group < 1
        ):
            raise ValueError(f"scale_group must be None or an int >= 1, got {self.scale_group!r}")
        if (self.scale_group is None) != (self.scale_bytes == 0):
            raise ValueError("scale_group and scale_bytes go together: both set (per-group scales) "
                             "or neither (per-tensor scale)")

    def bytes_per_token(self, n_layer: int, n_kv_head: int, d_head: int) -> int:
        """KV bytes per cached token in this format: payload plus per-group scales.

        Both terms come from ``servelab.kv.kv_bytes_per_token``: the scales are a cache whose "head
        dimension" is the number of groups per head.
        """
        payload = kv_bytes_per_token(n_layer, n_kv_head, d_head, self.bytes_per_elem)
        if self.scale_group is None:
            return payload
        if d_head % self.scale_group:
            raise ValueError(f"scale_group ({self.scale_group}) must divide d_head ({d_head})")
        return payload + kv_bytes_per_token(
            n_layer, n_kv_head, d_head // self.scale_group, self.scale_bytes
        )


KV_FORMATS = (
    KVFormat("bf16", 2),
    KVFormat("fp8 (per-tensor scale)", 1),
    KVFormat("int8 (fp16 scale per head vector)", 1, scale_bytes=2, scale_group=128),
)
"""The three cache formats the chapter compares; the int8 group of 128 matches a 128-wide head."""


@dataclass(frozen=True)
class KVCapacity:
    """What one KV memory budget holds in one format (all counts are whole tokens or requests)."""

    format: KVFormat
    bytes_per_token: int
    tokens: int
    requests: int


def kv_capacity(memory_bytes: int, n_layer: int, n_kv_head: int, d_head: int, context_tokens: int,
                formats: tuple[KVFormat, ...] = KV_FORMATS) -> list[KVCapacity]:
    """Tokens and full-length requests that ``memory_bytes`` of KV cache holds in each format.

    ``context_tokens`` is the cached length of one request (prompt plus output); ``requests`` is
    ``floor(tokens / context_tokens)``. Weights, workspaces and block-rounding are outside the
    budget.
    """
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 1:
        raise ValueError(f"memory_bytes must be an int >= 1, got {memory_bytes!r}")
    if (
        isinstance(context_tokens, bool)
        or not isinstance(context_tokens, int)
        or context_tokens < 1
    ):
        raise ValueError(f"context_tokens must be an int >= 1, got {context_tokens!r}")
    if not formats or not all(isinstance(f, KVFormat) for f in formats):
        raise ValueError("formats must be a non-empty tuple of KVFormat")
    rows = []
    for fmt in formats:
        per_token = fmt.bytes_per_token(n_layer, n_kv_head, d_head)
        tokens = memory_bytes // per_token
        rows.append(KVCapacity(fmt, per_token, tokens, tokens // context_tokens))
    return rows

