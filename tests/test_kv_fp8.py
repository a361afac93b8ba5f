"""Tests of servelab.kv.fp8: the e4m3 round trip and the logit error of an FP8 KV cache."""

from __future__ import annotations

import pytest
import torch

from servelab.kv.fp8 import (E4M3_MAX, Fp8KVAttention, fp8_round_trip, fp8_round_trip_per_head,
                             kv_fp8_logit_error, kv_store_logit_errors)
from servelab.model import load_checkpoint


def test_round_trip_keeps_e4m3_precision_and_clips_at_the_scale():
    x = torch.linspace(-3, 3, 1001)
    y = fp8_round_trip(x)
    assert y.dtype == x.dtype and E4M3_MAX == 448.0
    rel = ((y - x).abs() / x.abs().clamp_min(1e-3))[x.abs() > 0.1]
    assert 0 < float(rel.max()) <= 2 ** -4 + 1e-6  # 3 mantissa bits: half an ulp is 1/16
    assert float(fp8_round_trip(torch.tensor([1000.0]), scale=1.0)) == 448.0
    with pytest.raises(ValueError, match="scale"):
        fp8_round_trip(x, scale=0.0)
    with pytest.raises(ValueError, match="floating-point"):
        fp8_round_trip(torch.arange(3))


def test_fp8_kv_changes_logits_a_little_on_the_course_model():
    model = load_checkpoint(device="cpu", dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 64), generator=g).tolist()
    err = kv_fp8_logit_error(model, ids)
    assert err.positions == 128
    assert 0 < err.mean_abs_logit_diff < err.max_abs_logit_diff < 0.2 * err.logit_range
    assert err.top1_agreement > 0.8
    bf16 = kv_fp8_logit_error(model, ids, kv_dtype=torch.bfloat16)
    assert bf16.mean_abs_logit_diff < err.mean_abs_logit_diff  # 7 mantissa bits against 3
    with pytest.raises(ValueError, match="kv_dtype"):
        kv_fp8_logit_error(model, ids, kv_dtype=torch.int8)
    with pytest.raises(ValueError, match="equal-length"):
        kv_fp8_logit_error(model, [[1, 2], [3]])


def test_per_head_scales_follow_each_head_and_one_exact_pass_serves_every_store():
    x = torch.stack([torch.linspace(-1, 1, 64), 100 * torch.linspace(-1, 1, 64)], dim=-1)  # [64, 2]
    x = x.unsqueeze(-1).expand(64, 2, 4).contiguous()  # [tokens, heads, head_dim]
    per_tensor, per_head = fp8_round_trip(x), fp8_round_trip_per_head(x)
    small = slice(0, 64), 0
    assert (per_head[small] - x[small]).abs().max() < (per_tensor[small] - x[small]).abs().max()
    with pytest.raises(ValueError, match="heads, head_dim"):
        fp8_round_trip_per_head(torch.ones(3))
    model = load_checkpoint(device="cpu", dtype=torch.float32)
    ids = [list(range(1, 33))]
    errs = kv_store_logit_errors(model, ids, {"t": Fp8KVAttention(), "h": Fp8KVAttention(per_head=True)})
    assert errs["t"] == kv_fp8_logit_error(model, ids)
    assert errs["h"] == kv_fp8_logit_error(model, ids, per_head=True)
    with pytest.raises(ValueError, match="stores"):
        kv_store_logit_errors(model, ids, {})
