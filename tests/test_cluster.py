"""Tests of servelab.cluster (calculators, disaggregation), servelab.cluster.adapters (multi-LoRA cache) and servelab.viz.cluster."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from servelab import cluster
from servelab.cluster import adapters
from servelab.cluster.adapters import (
    AdapterKey,
    AdapterRegistry,
    AdapterRequest,
    DigestMismatch,
    GpuAdapterCache,
    HostAdapterCache,
    IncompatibleAdapter,
    LoadCosts,
    NoEvictableAdapter,
)
from servelab.cluster import Accelerator
from servelab.kv import kv_bytes_per_token
from servelab.metrics import capacity
from servelab.metrics.roofline import ModelShape, decode_cost, prefill_cost
from servelab.viz import cluster as viz

LLAMA8B = ModelShape(8_000_000_000, 32, 4096, 8, 128, 2)
LLAMA70B = ModelShape(70_000_000_000, 80, 8192, 8, 128, 2)
H100 = Accelerator(989e12, 3.35e12)
COSTS = LoadCosts(storage_bytes_per_ms=1e6, h2d_bytes_per_ms=20e6, hash_bytes_per_ms=2e6, setup_ms=1.0)
MIB = 2**20


# --------------------------------------------------------------------------------------------- TP


def test_ring_allreduce_volume_formula():
    assert cluster.ring_allreduce_bytes(1000, 1) == 0
    assert cluster.ring_allreduce_bytes(1000, 2) == 1000  # 2 * 1/2
    assert cluster.ring_allreduce_bytes(800, 4) == pytest.approx(1200)  # 2 * 3/4 * 800
    assert cluster.ring_allreduce_bytes(800, 8) == pytest.approx(1400)  # 2 * 7/8 * 800
    # tends to twice the message as the ring grows
    assert cluster.ring_allreduce_bytes(1, 1024) == pytest.approx(2 * 1023 / 1024)


def test_tp_message_is_two_allreduces_of_hidden():
    assert cluster.tp_allreduce_message_bytes(8192, 2) == 2 * 8192 * 2
    assert cluster.tp_allreduce_message_bytes(4096, 2, tokens=3) == 3 * 2 * 4096 * 2


def test_tp_decode_step_compute_splits_and_comm_counts_layers():
    one = cluster.tp_decode_step(LLAMA70B, 1, H100, 450e9, 0.0, batch=1, context_len=1024)
    four = cluster.tp_decode_step(LLAMA70B, 4, H100, 450e9, 0.0, batch=1, context_len=1024)
    assert one.comm_s == 0 and one.sent_bytes == 0
    assert four.compute_s == pytest.approx(one.compute_s / 4)
    per_layer = cluster.ring_allreduce_bytes(8192 * 2, 4) * 2
    assert four.sent_bytes == pytest.approx(80 * per_layer)
    assert four.comm_s == pytest.approx(four.sent_bytes / 450e9)
    # latency: 2 all-reduces x 80 layers x 2(t-1) ring steps
    slow = cluster.tp_decode_step(LLAMA70B, 4, H100, 450e9, 1e-6, batch=1, context_len=1024)
    assert slow.comm_s - four.comm_s == pytest.approx(2 * 80 * 6 * 1e-6)


def test_tp_on_a_slow_link_can_lose():
    pcie = [cluster.tp_decode_step(LLAMA70B, t, H100, 32e9, 10e-6).total_s for t in (4, 8)]
    assert pcie[1] > pcie[0]  # doubling TP made the step slower: communication outgrew the saving


# --------------------------------------------------------------------------------------------- PP / EP


def test_bubble_fraction_hand_values():
    assert Fraction(cluster.pp_bubble_fraction(4, 4)).limit_denominator() == Fraction(3, 7)
    assert cluster.pp_bubble_fraction(1, 5) == 0
    assert cluster.pp_bubble_fraction(4, 1) == pytest.approx(3 / 4)
    assert cluster.pp_bubble_fraction(4, 100) < cluster.pp_bubble_fraction(4, 10)


def test_pipeline_schedule_matches_bubble():
    for p, m in ((4, 4), (3, 2), (2, 7)):
        grid = cluster.pipeline_schedule(p, m)
        assert len(grid) == p and all(len(row) == m + p - 1 for row in grid)
        assert all(sorted(v for v in row if v is not None) == list(range(m)) for row in grid)
        idle = sum(v is None for row in grid for v in row) / (p * (m + p - 1))
        assert idle == pytest.approx(cluster.pp_bubble_fraction(p, m))
        # micro-batch j leaves stage s before entering stage s + 1
        for s in range(p - 1):
            assert grid[s].index(0) < grid[s + 1].index(0)


def test_ep_all_to_all_bytes():
    traffic = cluster.ep_all_to_all_bytes(tokens=256, hidden_size=4096, bytes_per_elem=2, top_k=2, ep=8)
    assert traffic.dispatch_bytes == 256 * 2 * 4096 * 2 * 7 / 8
    assert traffic.total_bytes == 2 * traffic.dispatch_bytes
    assert cluster.ep_all_to_all_bytes(256, 4096, 2, 2, 1).total_bytes == 0


def test_expert_loads_conserve_and_skew_imbalances():
    uniform = cluster.expert_rank_loads(2000, 64, 2, 8, skew=0.0, seed=1)
    skewed = cluster.expert_rank_loads(2000, 64, 2, 8, skew=1.2, seed=1)
    assert sum(uniform) == sum(skewed) == 2000 * 2
    assert max(skewed) / (sum(skewed) / 8) > max(uniform) / (sum(uniform) / 8) + 0.2


# --------------------------------------------------------------------------------------------- disaggregation


def test_disaggregation_bytes_come_from_kv():
    est = cluster.disaggregation_estimate(LLAMA8B, 2048, H100, 10e9, 1e-3, decode_streams=8)
    assert est.kv_bytes == 2048 * kv_bytes_per_token(32, 8, 128, 2)
    assert est.transfer_s == pytest.approx(1e-3 + est.kv_bytes / 10e9)
    assert est.saved_s == pytest.approx(8 * est.stall_s)


def test_short_prompt_rides_free_on_memory_bound_decode():
    est = cluster.disaggregation_estimate(LLAMA8B, 16, H100, 50e9, 0.0, decode_streams=8)
    assert est.stall_s * 8 < est.transfer_s / 5 and not est.worth_it  # only its KV write adds time


def test_disaggregation_net_is_monotonic_in_bandwidth():
    for prompt in (64, 512, 4096):
        nets = [cluster.disaggregation_estimate(LLAMA8B, prompt, H100, bw, 1e-4, 4).net_s
                for bw in (0.5e9, 1e9, 5e9, 25e9, 100e9, 400e9)]
        assert nets == sorted(nets) and nets[0] < nets[-1]


def test_break_even_bandwidth_is_the_sign_change():
    b_star = cluster.disaggregation_break_even_bandwidth(LLAMA8B, 1024, H100, 1e-4, 4)
    assert math.isfinite(b_star)
    below = cluster.disaggregation_estimate(LLAMA8B, 1024, H100, b_star * 0.9, 1e-4, 4)
    above = cluster.disaggregation_estimate(LLAMA8B, 1024, H100, b_star * 1.1, 1e-4, 4)
    assert not below.worth_it and above.worth_it
    assert cluster.disaggregation_break_even_bandwidth(LLAMA8B, 16, H100, 1e-4, 4) == math.inf
    # more decode streams to protect -> a slower link already pays
    assert cluster.disaggregation_break_even_bandwidth(LLAMA8B, 1024, H100, 1e-4, 16) < b_star


# --------------------------------------------------------------------------------------------- chunked prefill


def placements(prompt, **kw):
    args = dict(decode_streams=4, decode_context=1024, mfu=0.5, chunk_tokens=512, link_bandwidth=12.5e9,
                link_latency_s=1e-4)
    args.update(kw)
    return {p.strategy: p for p in cluster.compare_prefill_placements(LLAMA8B, prompt, H100, **args)}


def test_chunk_costs_add_up_to_the_whole_prefill():
    whole = prefill_cost(LLAMA8B, 1000)
    chunks = [cluster.prefill_chunk_cost(LLAMA8B, o, min(256, 1000 - o)) for o in range(0, 1000, 256)]
    assert cluster.prefill_chunk_cost(LLAMA8B, 0, 1000) == whole
    assert sum(c.flops for c in chunks) == whole.flops  # every (query, key) pair counted once
    # each chunk re-reads the weights and the KV of the chunks before it
    assert sum(c.bytes for c in chunks) > whole.bytes


def test_chunking_bounds_the_decode_gap_but_not_the_stream_delay():
    p = placements(8192)
    plain, chunked, disagg = p["co-located"], p["co-located, chunked"], p["disaggregated"]
    assert chunked.iterations == 16 and plain.iterations == 1
    assert chunked.worst_gap_s < plain.worst_gap_s / 10  # the ITL spike is gone
    assert 0 < chunked.stream_delay_s < plain.stream_delay_s  # the prefill's compute still lands on the streams
    assert chunked.ttft_s >= plain.ttft_s  # and the long prompt waits a little longer
    assert disagg.stream_delay_s == 0 and disagg.worst_gap_s < chunked.worst_gap_s
    assert disagg.ttft_s > plain.ttft_s  # the KV transfer lands on the new request
    alone = H100.seconds(decode_cost(LLAMA8B, 1024, 4).flops, decode_cost(LLAMA8B, 1024, 4).bytes, 0.5)
    assert disagg.worst_gap_s == pytest.approx(alone)
    assert plain.stream_delay_s == pytest.approx(
        cluster.disaggregation_estimate(LLAMA8B, 8192, H100, 12.5e9, 1e-4, 4).saved_s)


def test_a_prompt_within_one_chunk_is_not_chunked():
    p = placements(300)
    assert p["co-located, chunked"].iterations == 1
    assert p["co-located, chunked"].ttft_s == pytest.approx(p["co-located"].ttft_s)


def test_smaller_chunks_shorten_the_worst_gap():
    gaps = [placements(8192, chunk_tokens=c)["co-located, chunked"].worst_gap_s for c in (2048, 512, 128)]
    assert gaps == sorted(gaps, reverse=True)


def test_mfu_scales_compute_time_only():
    assert H100.seconds(1e12, 0, 0.5) == pytest.approx(2 * H100.seconds(1e12, 0))
    assert H100.seconds(0, 1e9, 0.5) == H100.seconds(0, 1e9)
    with pytest.raises(ValueError, match="mfu"):
        H100.seconds(1, 1, 0)


# --------------------------------------------------------------------------------------------- assumptions


def test_cluster_assumptions_state_the_inputs_once():
    a = cluster.ClusterAssumptions()
    rows = {r["assumption"]: r["value"] for r in a.rows()}
    assert rows["model-FLOP utilisation"] == "50 % of peak"
    assert rows["decode context"].startswith("1,024")
    assert "989 TFLOP/s" in rows["device"] and "3.35 TB/s" in rows["device"]
    changed = cluster.ClusterAssumptions(mfu=0.4, context_len=2048)
    assert {r["assumption"]: r["value"] for r in changed.rows()}["model-FLOP utilisation"] == "40 % of peak"
    with pytest.raises(ValueError, match="mfu"):
        cluster.ClusterAssumptions(mfu=1.2)
    with pytest.raises(TypeError, match="device"):
        cluster.ClusterAssumptions(device=(989e12, 3.35e12))


def test_seventy_b_sizing_from_the_assumptions():
    a = cluster.ClusterAssumptions()
    params = a.large_model.params
    by_format = {name: capacity.weight_bytes(params, b) for name, b in a.weight_formats}
    assert capacity.to_gb(by_format["FP16"]) == pytest.approx(140)
    assert capacity.to_gb(by_format["INT4"]) == pytest.approx(35)
    assert capacity.flops_per_token(params) == pytest.approx(140e9)  # 140 GFLOP, not TFLOP
    assert capacity.compute_rate(params, a.target_tokens_per_s) == pytest.approx(5.6e12)
    # one stream at 40 tokens/s reads more weight bytes than one device's bandwidth
    assert capacity.weight_read_rate(params, 2, a.target_tokens_per_s) > a.device.memory_bandwidth
    assert by_format["FP16"] > a.device_memory_bytes > by_format["INT4"]


# --------------------------------------------------------------------------------------------- adapter identity


def test_identity_includes_version_and_base():
    a = AdapterKey("llama-8b", "abc", 1, "finance")
    assert a != AdapterKey("llama-8b", "abc", 2, "finance")
    assert a != AdapterKey("llama-70b", "abc", 1, "finance")
    assert a != AdapterKey("llama-8b", "abd", 1, "finance")
    assert a == AdapterKey("llama-8b", "abc", 1, "renamed")  # the alias is a label
    assert a.namespace() != AdapterKey("llama-8b", "abc", 2).namespace()


def test_registry_resolves_latest_published_and_checks():
    reg = AdapterRegistry()
    v1 = reg.publish("fin", 1, "base", 10)
    v2 = reg.publish("fin", 2, "base", 10, published_ms=100)
    assert reg.resolve("fin", "base", 50).key == v1.key
    assert reg.resolve("fin", "base", 100).key == v2.key
    reg.publish("bad", 1, "base", 10, digest="0" * 64)
    with pytest.raises(DigestMismatch):
        reg.resolve("bad", "base", 0)
    reg.publish("other", 1, "different-base", 10)
    with pytest.raises(IncompatibleAdapter):
        reg.resolve("other", "base", 0)
    with pytest.raises(KeyError):
        reg.resolve("fin", "base", -1)
    with pytest.raises(ValueError, match="already published"):
        reg.publish("fin", 1, "base", 10)


# --------------------------------------------------------------------------------------------- adapter caches


def _key(i: int, version: int = 1) -> AdapterKey:
    return AdapterKey("base", f"d{i}", version, f"a{i}")


def test_gpu_cache_never_evicts_referenced_adapter():
    cache = GpuAdapterCache(2)
    cache.reserve(_key(0))
    cache.bind(_key(0), "r0")
    cache.reserve(_key(1))
    cache.bind(_key(1), "r1")
    with pytest.raises(NoEvictableAdapter):
        cache.reserve(_key(2))
    assert cache.resident == [_key(0), _key(1)]
    assert cache.release(_key(1), "r1") and not cache.release(_key(1), "r1")  # idempotent
    assert cache.reserve(_key(2)) == _key(1)  # the only unreferenced one, although key 0 is older
    assert _key(0) in cache and cache.refcount(_key(0)) == 1


def test_gpu_cache_evicts_least_recently_used_unreferenced():
    cache = GpuAdapterCache(2)
    for i in (0, 1):
        cache.reserve(_key(i))
        cache.bind(_key(i), f"r{i}")
    cache.release(_key(1), "r1")
    cache.release(_key(0), "r0")  # key 0 used more recently
    assert cache.reserve(_key(2)) == _key(1)


def test_two_versions_are_two_entries():
    cache = GpuAdapterCache(3)
    cache.reserve(_key(0, 1))
    cache.reserve(_key(0, 2))
    assert len(cache.resident) == 2
    with pytest.raises(ValueError, match="already resident"):
        cache.reserve(_key(0, 2))


def test_host_cache_is_bounded_by_bytes():
    host = HostAdapterCache(100)
    assert host.put(_key(0), 60) == []
    assert host.put(_key(1), 60) == [_key(0)]
    assert host.used_bytes == 60
    assert host.put(_key(2), 101) == [] and _key(2) not in host


# --------------------------------------------------------------------------------------------- simulation


def _registry(n: int, size: int = 64 * MIB) -> AdapterRegistry:
    reg = AdapterRegistry()
    for i in range(n):
        reg.publish(f"a{i}", 1, "base", size)
    return reg


def _busy_intervals(result):
    return [(r.key, r.admit_ms, r.end_ms) for r in result.records if r.admit_ms is not None]


def test_simulation_never_evicts_in_flight_adapter():
    names = [f"a{i}" for i in range(8)]
    load = adapters.adapter_workload(300, names, mean_gap_ms=10, service_ms=200, skew=0.8, cancel_share=0.2, seed=3)
    result = adapters.simulate_adapter_serving(load, _registry(8), "base", 3, 4 * 64 * MIB, 8, COSTS)
    assert result.evictions
    # replay: at every eviction, no admitted request bound to the victim may still be in flight
    evict_times = []
    for r in result.records:
        for step, detail in r.steps:
            if detail.startswith("evicted"):
                evict_times.append((r.admit_ms, detail.split()[1]))
    assert len(evict_times) == len(result.evictions)
    for at, label in evict_times:
        live = [r for r in result.records if r.key is not None and r.key.label() == label
                and r.admit_ms < at < r.end_ms]
        assert not live, f"{label} evicted at {at} while {live[0].request_id} was in flight"


def test_simulation_counts_and_capacity():
    names = [f"a{i}" for i in range(6)]
    load = adapters.adapter_workload(200, names, mean_gap_ms=15, service_ms=100, skew=1.0, seed=0)
    small = adapters.simulate_adapter_serving(load, _registry(6), "base", 2, 0, 4, COSTS)
    big = adapters.simulate_adapter_serving(load, _registry(6), "base", 6, 0, 4, COSTS)
    assert big.cold_loads == 6 and big.gpu_hit_rate > small.gpu_hit_rate
    assert small.storage_fetches == small.cold_loads  # a zero-byte host cache never hits
    assert all(r.status == "finished" for r in big.records)
    hits = [r for r in big.records if r.gpu_hit]
    assert hits and all(r.load_ms == 0 and r.start_ms == r.admit_ms for r in hits)


def test_requests_bind_to_the_version_current_at_admission():
    reg = _registry(1)
    reg.publish("a0", 2, "base", 64 * MIB, published_ms=50)
    load = [AdapterRequest("early", 0, "a0", 500), AdapterRequest("late", 60, "a0", 10)]
    result = adapters.simulate_adapter_serving(load, reg, "base", 2, 0, 4, COSTS)
    early, late = result.records
    assert (early.key.version, late.key.version) == (1, 2)
    assert early.end_ms > late.end_ms  # v1 stayed bound (and resident) while v2 served
    assert result.cold_loads == 2


def test_cancel_releases_and_failures_touch_nothing():
    reg = _registry(1)
    reg.publish("evil", 1, "base", 10, digest="f" * 64)
    load = [AdapterRequest("c", 0, "a0", 1000, cancel_after_ms=200), AdapterRequest("x", 1, "evil", 5),
            AdapterRequest("late", 300, "a0", 5)]
    result = adapters.simulate_adapter_serving(load, reg, "base", 1, 0, 1, COSTS)
    cancelled, failed, late = result.records
    assert cancelled.status == "cancelled" and cancelled.end_ms == 200
    assert cancelled.steps[-1] == ("6 release", "cancelled: reference dropped")
    assert failed.status == "failed" and failed.key is None and "digest" in failed.steps[0][1]
    assert late.status == "finished" and late.gpu_hit  # slot freed by the cancel, adapter still resident
    assert result.cold_loads == 1


def test_waiting_head_times_out_when_no_slot_frees():
    load = [AdapterRequest("hold", 0, "a0", 1000), AdapterRequest("blocked", 1, "a1", 5, deadline_ms=100),
            AdapterRequest("after", 1200, "a1", 5)]
    result = adapters.simulate_adapter_serving(load, _registry(2), "base", 1, 0, 4, COSTS)
    assert [r.status for r in result.records] == ["finished", "timed_out", "finished"]
    assert result.records[1].end_ms == 101


# --------------------------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("call, name", [
    (lambda: cluster.pp_bubble_fraction(0, 4), "stages"),
    (lambda: cluster.pp_bubble_fraction(4, 0), "microbatches"),
    (lambda: cluster.ring_allreduce_bytes(-1, 2), "message_bytes"),
    (lambda: cluster.ring_allreduce_bytes(10, 0), "world_size"),
    (lambda: cluster.tp_allreduce_message_bytes(0, 2), "hidden_size"),
    (lambda: cluster.tp_decode_step(LLAMA8B, 2, H100, 0, 0), "link_bandwidth"),
    (lambda: cluster.ep_all_to_all_bytes(10, 16, 2, 0, 2), "top_k"),
    (lambda: cluster.expert_rank_loads(10, 10, 2, 3, 1.0), "ep"),
    (lambda: cluster.expert_rank_loads(10, 4, 5, 2, 1.0), "top_k"),
    (lambda: cluster.disaggregation_estimate(LLAMA8B, 0, H100, 1e9, 0, 1), "prompt_tokens"),
    (lambda: cluster.disaggregation_estimate(LLAMA8B, 10, H100, 1e9, -1, 1), "link_latency_s"),
    (lambda: cluster.disaggregation_estimate(LLAMA8B, 10, H100, 1e9, 0, 1, mfu=1.5), "mfu"),
    (lambda: Accelerator(0, 1), "peak_flops"),
    (lambda: cluster.prefill_chunk_cost(LLAMA8B, -1, 4), "offset"),
    (lambda: placements(1024, chunk_tokens=0), "chunk_tokens"),
    (lambda: placements(1024, decode_streams=0), "decode_streams"),
    (lambda: GpuAdapterCache(0), "capacity"),
    (lambda: LoadCosts(0, 1, 1), "storage_bytes_per_ms"),
    (lambda: AdapterRequest("r", 0, "a", 0), "service_ms"),
    (lambda: adapters.adapter_workload(5, ["a"], mean_gap_ms=1, service_ms=1, skew=0, cancel_share=2), "cancel_share"),
    (lambda: adapters.simulate_adapter_serving([AdapterRequest("r", 0, "a", 1)], AdapterRegistry(), "b", 1, 0, 0,
                                              COSTS), "max_running"),
])
def test_bad_inputs_name_the_parameter(call, name):
    with pytest.raises((TypeError, ValueError), match=name):
        call()


def test_bad_types_rejected():
    with pytest.raises(TypeError, match="model"):
        cluster.tp_decode_step("70b", 2, H100, 1e9, 0)
    with pytest.raises(TypeError, match="tp"):
        cluster.tp_decode_step(LLAMA8B, 2.0, H100, 1e9, 0)
    with pytest.raises(ValueError, match="unique"):
        adapters.simulate_adapter_serving([AdapterRequest("r", 0, "a", 1)] * 2, AdapterRegistry(), "b", 1, 0, 1, COSTS)


# --------------------------------------------------------------------------------------------- figures


def test_figures_build_with_fixed_trace_counts():
    steps = [cluster.tp_decode_step(LLAMA70B, t, H100, 450e9, 2e-6) for t in (1, 2, 4, 8)]
    assert len(viz.tp_figure(steps, "x").data) == 2
    assert "42.9%" in viz.pipeline_figure(4, 4).layout.title.text
    prompts = [64, 256, 1024, 4096]
    figs = [viz.disaggregation_figure(LLAMA8B, H100, prompts, bandwidth_gbs=b, decode_streams=4, latency_ms=0.1)
            for b in (1, 100)]
    assert {len(f.data) for f in figs} == {2}
    assert "pays from" in figs[1].layout.title.text
    loads = cluster.expert_rank_loads(100, 16, 2, 4, 1.0)
    assert "busiest rank" in viz.ep_load_figure(loads, 1.0, 200).layout.title.text
    with pytest.raises(ValueError):
        viz.tp_figure([], "x")
