"""KV bytes beyond the uniform formula (MLA, sliding window, transfer) and the FP8 round trip."""

from __future__ import annotations

import pytest
import torch

from servelab.kv import kv_bytes_per_token
from servelab.kv.footprint import kv_transfer_seconds, mla_kv_bytes_per_token, sequence_kv_bytes
from servelab.kv.fp8 import E4M3_MAX, E4M3_UNIT_ROUNDOFF, fp8_relative_error, fp8_round_trip


def test_mla_caches_one_latent_per_layer():
    assert mla_kv_bytes_per_token(61, 512, 64, 2) == 61 * 576 * 2
    assert mla_kv_bytes_per_token(1, 4, 0, 1) == 4


def test_full_attention_stack_reduces_to_the_uniform_formula():
    for context in (0, 1, 513):
        assert sequence_kv_bytes(context, [None] * 4, 8, 64, 2) == context * kv_bytes_per_token(4, 8, 64, 2)


def test_sliding_window_layers_stop_growing_at_the_window():
    short, long = (sequence_kv_bytes(n, [128, 128], 1, 1, 1) for n in (100, 10_000))
    assert (short, long) == (2 * 2 * 100, 2 * 2 * 128)
    mixed = sequence_kv_bytes(10_000, [None, 128], 1, 1, 1)
    assert mixed == 2 * (10_000 + 128)


def test_transfer_is_bytes_over_bandwidth():
    assert kv_transfer_seconds(8192, 327_680, 50e9) == pytest.approx(8192 * 327_680 / 50e9)
    assert kv_transfer_seconds(0, 1, 1) == 0.0


@pytest.mark.parametrize("call, name", [
    (lambda: mla_kv_bytes_per_token(0, 512, 64, 2), "n_layer"),
    (lambda: mla_kv_bytes_per_token(1, 512, -1, 2), "rope_head_dim"),
    (lambda: sequence_kv_bytes(10, [], 1, 1, 1), "layer_windows"),
    (lambda: sequence_kv_bytes(10, [None, 0], 1, 1, 1), "layer_windows\\[1\\]"),
    (lambda: sequence_kv_bytes(-1, [None], 1, 1, 1), "context_tokens"),
    (lambda: kv_transfer_seconds(1, 1, 0), "link_bytes_per_s"),
])
def test_bad_arguments_name_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_fp8_round_trip_stays_within_the_unit_roundoff():
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
    back = fp8_round_trip(x)
    assert back.dtype == x.dtype and back.shape == x.shape and not torch.equal(back, x)
    scale = x.abs().max() / E4M3_MAX
    normal = x.abs() >= scale * 2.0 ** -6  # e4m3's smallest normal, scaled
    rel = ((back - x).abs() / x.abs())[normal]
    assert float(rel.max()) <= E4M3_UNIT_ROUNDOFF * (1 + 1e-6)
    assert 0.01 < fp8_relative_error(x) < E4M3_UNIT_ROUNDOFF


def test_fp8_keeps_the_maximum_and_zero_exactly():
    x = torch.tensor([0.0, -3.0, 1.5, 0.0])
    assert torch.equal(fp8_round_trip(x), x)
    assert fp8_relative_error(torch.zeros(3)) == 0.0


@pytest.mark.parametrize("bad", [torch.tensor([]), torch.tensor([1, 2]), torch.tensor([1.0, float("inf")]), [1.0]])
def test_fp8_rejects_what_is_not_a_finite_float_tensor(bad):
    with pytest.raises(ValueError, match="x must"):
        fp8_relative_error(bad)
