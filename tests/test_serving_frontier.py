"""Tests of the arithmetic for today's serving topics: MoE active vs total parameters, the decode
step split per kernel, KV offload tiers, cost per million tokens, draft heads, DistServe's goodput,
one-shot all-reduce and the FP8 KV cache."""

from __future__ import annotations

import math

import pytest

from servelab.bench.goodput_search import attainment_at, distserve_goodput
from servelab.metrics.capacity import expected_tokens_per_cycle
from servelab.cluster.assumptions import Accelerator
from servelab.cluster.parallelism import allreduce_seconds, ring_allreduce_bytes, tp_decode_step
from servelab.cluster.token_cost import cost_per_1000_requests, cost_per_million_tokens
from servelab.kv.offload import (GPU_HBM, OFFLOAD_TIERS, OffloadTier, recompute_seconds,
                                 reload_breakeven_bandwidth, reload_seconds)
from servelab.metrics.roofline import ModelShape, decode_cost
from servelab.metrics.roofline.kernels import decode_attention_cost, decode_weight_cost, first_batch_at_ridge
from servelab.metrics.roofline.moe import MIXTRAL_8X7B, QWEN3_30B_A3B, MoEShape, experts_touched
from servelab.sampling.draft_heads import (acceptance_rate_for_length, cycle_cost,
                                           speedup_over_decode)

BIG = ModelShape(70_000_000_000, 80, 8192, 8, 128, 2)


# --- MoE -------------------------------------------------------------------------------------------

def test_qwen3_moe_totals_match_the_published_sizes():
    # the model card: 30.5B total, 3.3B activated
    assert QWEN3_30B_A3B.total_params / 1e9 == pytest.approx(30.5, abs=0.05)
    assert QWEN3_30B_A3B.active_params / 1e9 == pytest.approx(3.3, abs=0.06)
    assert QWEN3_30B_A3B.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2
    assert round(MIXTRAL_8X7B.total_params / 1e9, 1) == 46.7        # Mixtral's published 46.7B
    assert abs(MIXTRAL_8X7B.active_params / 1e9 - 12.9) < 0.06      # and 12.9B active


def test_moe_weights_follow_total_and_flops_follow_active():
    m = QWEN3_30B_A3B
    assert m.weight_bytes == 2 * m.total_params
    assert m.flops_per_token == 2 * (m.active_params - m.vocab_size * m.hidden_size)
    dense_like = MoEShape("d", 48, 2048, 32, 4, 128, 8, 8, 768, 151_936)
    assert dense_like.total_params == dense_like.active_params


def test_experts_touched_grows_from_top_k_to_all():
    assert experts_touched(128, 8, 1) == pytest.approx(8)
    assert experts_touched(128, 8, 10_000) == pytest.approx(128)
    assert experts_touched(128, 8, 0) == 0
    with pytest.raises(ValueError, match="batch"):
        experts_touched(8, 2, -1)
    small, big = (QWEN3_30B_A3B.decode_weight_bytes(b) for b in (1, 512))
    assert small == pytest.approx(2 * QWEN3_30B_A3B.active_params, rel=1e-6)
    assert big == pytest.approx(QWEN3_30B_A3B.weight_bytes, rel=1e-3)
    with pytest.raises(ValueError, match="top_k"):
        experts_touched(8, 9, 1)
    with pytest.raises(ValueError, match="top_k must be <= n_experts"):
        MoEShape("bad", 1, 8, 1, 1, 8, 4, 5, 8, 10)


# --- the decode step per kernel ---------------------------------------------------------------------

def test_kernels_add_up_to_the_decode_step():
    for batch in (1, 64):
        w, a = decode_weight_cost(BIG, batch), decode_attention_cost(BIG, 4096, batch)
        total = decode_cost(BIG, 4096, batch)
        assert w.flops + a.flops == total.flops and w.bytes + a.bytes == total.bytes


def test_weight_gemms_cross_the_ridge_and_attention_never_does():
    ridge = 312e12 / 2.039e12
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    weights = [(b, decode_weight_cost(BIG, b)) for b in batches]
    attention = [(b, decode_attention_cost(BIG, 4096, b)) for b in batches]
    assert first_batch_at_ridge(weights, ridge) == 256  # bf16: intensity = batch FLOP/byte
    assert first_batch_at_ridge(attention, ridge) is None
    assert len({round(c.intensity, 9) for _, c in attention}) == 1


# --- offload tiers ----------------------------------------------------------------------------------

def test_reload_beats_recompute_above_the_breakeven_bandwidth():
    m, p, f = BIG.kv_bytes_per_token, 70e9, 989e12 * 0.5
    bw = reload_breakeven_bandwidth(m, p, f)
    fast = OffloadTier("fast", bw * 2, 0.0, 1e12)
    slow = OffloadTier("slow", bw / 2, 0.0, 1e12)
    assert reload_seconds(4096, m, fast) < recompute_seconds(4096, p, f) < reload_seconds(4096, m, slow)
    assert all(t.bandwidth < GPU_HBM.bandwidth for t in OFFLOAD_TIERS)
    with pytest.raises(ValueError, match="tier must be an OffloadTier"):
        reload_seconds(1, m, "ssd")
    with pytest.raises(ValueError, match="bandwidth"):
        OffloadTier("x", 0, 0, 1)


# --- cost ------------------------------------------------------------------------------------------

def test_cost_per_million_tokens_and_per_request_agree():
    per_m = cost_per_million_tokens(3.6, 1000)
    assert per_m == pytest.approx(1.0)
    assert cost_per_million_tokens(3.6, 1000, utilisation=0.5) == pytest.approx(2.0)
    assert cost_per_1000_requests(3.6, 1000, 500) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="tokens_per_s"):
        cost_per_million_tokens(3.6, 0)
    with pytest.raises(ValueError, match="utilisation"):
        cost_per_million_tokens(3.6, 10, 1.5)


# --- draft heads ----------------------------------------------------------------------------------

def test_acceptance_length_round_trips_and_speedup_prefers_the_cheaper_drafter():
    a = acceptance_rate_for_length(3.0, 4)
    assert expected_tokens_per_cycle(a, 4) == pytest.approx(3.0, abs=1e-8)
    assert cycle_cost(4, 0.1) == pytest.approx(1.4)
    assert speedup_over_decode(0.8, 4, 0.02) > speedup_over_decode(0.8, 4, 0.12)
    assert speedup_over_decode(0.0, 4, 0.1) < 1
    with pytest.raises(ValueError, match="mean_length"):
        acceptance_rate_for_length(6.0, 4)


# --- goodput -------------------------------------------------------------------------------------

def test_distserve_goodput_is_the_highest_rate_meeting_the_target():
    kw = dict(seeds=[0, 1], duration_s=30.0, ttft_slo=0.5, tpot_slo=0.05, target=0.9)
    search = distserve_goodput([2, 4, 8, 16, 32, 64], bisect_steps=3, **kw)
    assert search.first_miss is not None and search.goodput < search.first_miss
    for rate, worst in zip(search.rates, search.worst_attainment):
        assert worst == min(attainment_at(rate, s, 30.0, 0.5, 0.05) for s in (0, 1))
        if rate <= search.goodput:
            assert worst >= 0.9
    assert min(a for r, a in zip(search.rates, search.worst_attainment)
               if r == search.first_miss) < 0.9
    with pytest.raises(ValueError, match="strictly increasing"):
        distserve_goodput([4, 2], **kw)


# --- all-reduce -----------------------------------------------------------------------------------

def test_one_shot_allreduce_latency_is_flat_in_world_size():
    msg, bw, lat = 16_384, 450e9, 5e-6
    ring = [allreduce_seconds(msg, t, bw, lat, "ring") for t in (2, 4, 8)]
    one = [allreduce_seconds(msg, t, bw, lat, "one-shot") for t in (2, 4, 8)]
    assert ring[2] > 3 * ring[0]
    assert one[2] < 1.1 * one[0]
    assert ring[0] == pytest.approx(2 * lat + ring_allreduce_bytes(msg, 2) / bw)
    dev = Accelerator(989e12, 3.35e12)
    assert (tp_decode_step(BIG, 8, dev, bw, lat, allreduce="one-shot").comm_s
            < tp_decode_step(BIG, 8, dev, bw, lat).comm_s)
    assert math.isclose(allreduce_seconds(msg, 1, bw, lat), 0.0)
    with pytest.raises(ValueError, match="algorithm"):
        allreduce_seconds(msg, 2, bw, lat, "tree")


# --- figures --------------------------------------------------------------------------------------

def test_frontier_figures_draw_the_library_numbers():
    import plotly.graph_objects as go

    from servelab.viz import frontier as vf

    search = distserve_goodput([2, 4, 8], seeds=[0], duration_s=20.0, ttft_slo=0.5, tpot_slo=0.05,
                               bisect_steps=1)
    fig = vf.goodput_search_figure(search)
    assert isinstance(fig, go.Figure) and list(fig.data[0].x) == list(search.rates)
    assert fig.data[2].x[0] == search.goodput
    moe = vf.moe_weight_read_figure([1, 64], {"moe": [QWEN3_30B_A3B.decode_weight_bytes(b) for b in (1, 64)]})
    assert moe.data[0].y[0] == pytest.approx(QWEN3_30B_A3B.decode_weight_bytes(1) / 1e9)
    tiers = vf.offload_tier_figure([64, 4096], {t.name: [1e-3, 2e-3] for t in OFFLOAD_TIERS}, [0.5, 1.0])
    assert len(tiers.data) == len(OFFLOAD_TIERS) + 1
    acc = vf.acceptance_length_figure([0.5, 0.9], {4: [expected_tokens_per_cycle(a, 4) for a in (0.5, 0.9)]})
    assert acc.data[0].y[1] == pytest.approx(expected_tokens_per_cycle(0.9, 4))
    ar = vf.allreduce_figure([2, 8], {"ring": [1e-6, 2e-6]})
    assert list(ar.data[0].y) == pytest.approx([1.0, 2.0])
    for builder, args in ((vf.moe_weight_read_figure, ([], {})), (vf.allreduce_figure, ([2], {}))):
        with pytest.raises(ValueError, match="non-empty"):
            builder(*args)
    with pytest.raises(ValueError, match="GoodputSearch"):
        vf.goodput_search_figure("search")
