"""Weight-only int8: error bounds, logits close to fp32, bytes ~1/4; KV-format capacity arithmetic."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from servelab.metrics.capacity import kv_bytes_for_tokens
from servelab.model import LlamaConfig, LlamaForCausalLM
from servelab.optimizations.quantization import (KV_FORMATS, PROJECTION_NAMES, Int8Linear, KVFormat, dequantize_int8, kv_capacity,
                                   model_weight_bytes, quantize_model, quantize_model_dynamic,
                                   quantize_per_channel_int8)

torch.set_num_threads(1)

CFG = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
LOGIT_ATOL = 0.05
"""Stated tolerance: int8 logits within 0.05 (absolute) of fp32 on this model, whose logits span ~±3."""


@pytest.fixture(scope="module")
def fp32_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(CFG).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.05)
    return model


def test_per_channel_error_is_at_most_half_a_step():
    torch.manual_seed(1)
    w = torch.randn(32, 48) * torch.logspace(-3, 1, 32)[:, None]  # rows of very different magnitude
    q, scale = quantize_per_channel_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (32,)
    assert int(q.abs().max()) == 127  # each row's largest entry uses the full range
    error = (dequantize_int8(q, scale) - w).abs()
    assert torch.all(error <= scale[:, None] / 2 + 1e-7)
    # one scale per tensor would wreck the small rows; per-channel keeps relative error small everywhere
    relative = error.amax(dim=1) / w.abs().amax(dim=1)
    assert relative.max() < 1 / 254 + 1e-6


def test_zero_row_is_exact():
    w = torch.zeros(2, 4)
    w[1] = torch.tensor([1.0, -2.0, 0.5, 0.0])
    q, scale = quantize_per_channel_int8(w)
    assert torch.equal(dequantize_int8(q, scale)[0], torch.zeros(4))


def test_int8_linear_matches_dequantized_weight():
    torch.manual_seed(2)
    linear = nn.Linear(24, 40, bias=False)
    layer = Int8Linear.from_linear(linear)
    x = torch.randn(3, 5, 24)
    expected = x @ dequantize_int8(layer.weight_q, layer.scale).T
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
    assert (layer(x) - linear(x)).abs().max() < 0.02  # and close to the fp32 layer


def test_quantized_model_logits_close_to_fp32(fp32_model):
    int8 = quantize_model(copy.deepcopy(fp32_model))
    ids = torch.randint(0, CFG.vocab_size, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref, got = fp32_model(ids), int8(ids)
    diff = (ref - got).abs().max().item()
    assert 0 < diff < LOGIT_ATOL  # changed (really quantized), but only slightly
    assert (ref.argmax(-1) == got.argmax(-1)).float().mean() > 0.9


def test_quantize_model_replaces_every_projection_and_only_those(fp32_model):
    int8 = quantize_model(copy.deepcopy(fp32_model))
    for layer in int8.model.layers:
        for name in PROJECTION_NAMES:
            block = layer.self_attn if hasattr(layer.self_attn, name) else layer.mlp
            assert isinstance(getattr(block, name), Int8Linear)
    assert isinstance(int8.lm_head, nn.Linear)
    assert int8.lm_head.weight is int8.model.embed_tokens.weight  # the tie survives
    with pytest.raises(ValueError, match="already quantized"):
        quantize_model(int8)
    with pytest.raises(TypeError, match="model must be a LlamaForCausalLM"):
        quantize_model(nn.Linear(2, 2))


def test_weight_bytes_quarter_plus_scales(fp32_model):
    int8 = quantize_model(copy.deepcopy(fp32_model))
    before, after = model_weight_bytes(fp32_model), model_weight_bytes(int8)
    projections = [getattr(block, name) for layer in fp32_model.model.layers
                   for block in (layer.self_attn, layer.mlp) for name in PROJECTION_NAMES if hasattr(block, name)]
    proj_fp32 = sum(p.weight.numel() * 4 for p in projections)
    out_channels = sum(p.weight.shape[0] for p in projections)
    assert after["int8_weights"] == proj_fp32 // 4
    assert after["scales"] == 4 * out_channels
    assert after["float_weights"] == before["total"] - proj_fp32  # embeddings/norms untouched, tied counted once
    assert before["total"] == sum(p.numel() * 4 for p in fp32_model.parameters())  # parameters() dedups ties
    assert after["total"] < before["total"]


def test_kv_capacity_reuses_kv_formula():
    geometry = dict(n_layer=80, n_kv_head=8, d_head=128)
    rows = kv_capacity(20 * 2**30, **geometry, context_tokens=8192)
    bf16, fp8, int8 = rows
    assert bf16.bytes_per_token == kv_bytes_for_tokens(1, 80, 8, 128, 2) == 327_680
    assert bf16.requests == 8  # 2.5 GiB per 8,192-token request
    assert fp8.bytes_per_token == bf16.bytes_per_token // 2
    assert fp8.tokens == 2 * bf16.tokens
    # one fp16 scale per 128-element head vector: 2 bytes per 128 -> 1/64 overhead on top of int8
    assert int8.bytes_per_token == fp8.bytes_per_token + 2 * 80 * 8 * 2
    assert bf16.tokens < int8.tokens < fp8.tokens


@pytest.mark.parametrize(("call", "match"), [
    (lambda: kv_capacity(0, 2, 2, 4, 16), "memory_bytes"),
    (lambda: kv_capacity(1024, 2, 2, 4, 0), "context_tokens"),
    (lambda: kv_capacity(1024, 2, 2, 6, 16, (KV_FORMATS[2],)), "scale_group \\(128\\) must divide d_head"),
    (lambda: KVFormat("bad", 0), "bytes_per_elem"),
    (lambda: KVFormat("bad", 1, scale_bytes=2), "scale_group and scale_bytes"),
    (lambda: quantize_per_channel_int8(torch.ones(3)), "2-D"),
    (lambda: quantize_per_channel_int8(torch.tensor([[float("nan")]])), "finite"),
    (lambda: Int8Linear(torch.zeros(2, 2, dtype=torch.int8), torch.ones(3)), "scale must be"),
    (lambda: Int8Linear.from_linear(nn.Linear(2, 2, bias=True)), "no bias"),
])
def test_bad_inputs_name_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_dynamic_int8_reads_int8_codes_and_stays_close(fp32_model):
    kernel = quantize_model_dynamic(copy.deepcopy(fp32_model))
    layer = kernel.model.layers[0]
    assert all(isinstance(getattr(block, name), torch.ao.nn.quantized.dynamic.Linear)
               for block in (layer.self_attn, layer.mlp) for name in PROJECTION_NAMES if hasattr(block, name))
    assert isinstance(kernel.lm_head, nn.Linear)  # the tied LM head and the embeddings stay float
    ids = torch.randint(0, CFG.vocab_size, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref, got = fp32_model(ids), kernel(ids)
    assert 0 < (ref - got).abs().max().item() < 2 * LOGIT_ATOL  # activations are int8 too: a little looser
    assert (ref.argmax(-1) == got.argmax(-1)).float().mean() > 0.9
    with pytest.raises(ValueError, match="no floating-point projections"):
        quantize_model_dynamic(kernel)


def test_dynamic_int8_bytes_match_weight_only(fp32_model):
    weight_only = model_weight_bytes(quantize_model(copy.deepcopy(fp32_model)))
    kernel = model_weight_bytes(quantize_model_dynamic(copy.deepcopy(fp32_model)))
    assert kernel["int8_weights"] == weight_only["int8_weights"]  # the same codes: one byte per weight
    assert kernel["float_weights"] == weight_only["float_weights"]
    assert kernel["scales"] > 0
