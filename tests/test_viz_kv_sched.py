"""servelab.cluster.routing and the figures of the KV-cache and scheduling chapters (servelab.viz.kv,
servelab.viz.scheduling): simulation results, argument validation, and that every figure draws what the
library computed. No model is loaded: pools come from BlockAllocator, traces from the simulations or
hand-made StepRecords."""

from fractions import Fraction

import plotly.graph_objects as go
import pytest

from servelab.scheduling.batching import (PrefillRequest, Request, chunked_prefill_scenario, simulate_batching,
                               simulate_iterations)
from servelab.engine.trace import StepRecord
from servelab.kv import BlockAllocator
from servelab.cluster.routing import (ROUTING_POLICIES, PrefixRequest, ReplicaModel, TenantQuota, prefix_workload,
                              route_requests)
from servelab.viz import kv as kv_viz
from servelab.viz import scheduling as sched_viz
from servelab.viz.core import Table

MODEL = ReplicaModel(prefill_ms_per_token=0.05, decode_ms_per_token=1.0, cache_slots=2)


def skewed(n=200, seed=0):
    return prefix_workload(n, mean_gap_ms=40, hot_share=0.7, num_cold_prefixes=6, prefix_tokens=2000,
                           suffix_tokens=100, output_tokens=100, seed=seed)


# ----------------------------------------------------------------------------------------------- routing


def test_route_requests_conserves_and_orders_every_request():
    load = skewed()
    for policy in ROUTING_POLICIES:
        result = route_requests(load, 4, policy, MODEL)
        assert sorted(r.name for r in result.requests) == sorted(r.name for r in load)
        assert sum(result.requests_per_replica()) == len(load)
        for r in result.requests:
            assert r.start >= r.arrival and r.finish > r.start
        for replica in range(4):  # one request at a time per replica
            mine = [r for r in result.requests if r.replica == replica]
            assert all(a.finish <= b.start + 1e-9 for a, b in zip(mine, mine[1:]))


def test_max_hit_wins_hit_rate_but_not_completion_time():
    for seed in range(3):
        results = {p: route_requests(skewed(seed=seed), 4, p, MODEL) for p in ROUTING_POLICIES}
        assert max(results.values(), key=lambda r: r.hit_rate).policy == "max-hit"
        assert results["min-completion"].mean_completion_ms < results["max-hit"].mean_completion_ms
        assert results["min-completion"].mean_completion_ms <= results["round-robin"].mean_completion_ms


def test_hit_skips_prefix_prefill_and_single_replica_is_fifo():
    reqs = [PrefixRequest("a", 0, "p", 100, 10, 5), PrefixRequest("b", 0, "p", 100, 10, 5)]
    model = ReplicaModel(prefill_ms_per_token=1.0, decode_ms_per_token=2.0, cache_slots=1)
    result = route_requests(reqs, 1, "max-hit", model)
    a, b = result.requests
    assert (a.hit, b.hit) == (False, True)
    assert a.finish == 110 + 10 and b.start == a.finish and b.finish == a.finish + 10 + 10
    assert result.hit_rate == 0.5 and result.completion_percentile_ms(100) == b.completion_ms


def test_lru_cache_forgets_the_oldest_prefix():
    model = ReplicaModel(prefill_ms_per_token=1.0, decode_ms_per_token=1.0, cache_slots=1)
    reqs = [PrefixRequest(n, i * 1000, p, 10, 1, 1) for i, (n, p) in enumerate([("a", "x"), ("b", "y"),
                                                                                ("c", "x")])]
    assert [r.hit for r in route_requests(reqs, 1, "round-robin", model).requests] == [False, False, False]


def test_prefix_workload_is_seeded_and_skewed():
    assert skewed(seed=5) == skewed(seed=5)
    load = skewed(1000)
    hot = sum(r.prefix == "hot" for r in load) / len(load)
    assert 0.65 < hot < 0.75
    assert all(b.arrival >= a.arrival for a, b in zip(load, load[1:]))


@pytest.mark.parametrize("kwargs, error", [
    ({"requests": [], "num_replicas": 2, "policy": "max-hit"}, ValueError),
    ({"num_replicas": 0, "policy": "max-hit"}, ValueError),
    ({"num_replicas": 2, "policy": "fastest"}, ValueError),
    ({"num_replicas": 2.0, "policy": "max-hit"}, TypeError),
])
def test_route_requests_rejects_bad_arguments(kwargs, error):
    kwargs.setdefault("requests", skewed(5))
    with pytest.raises(error):
        route_requests(model=MODEL, **kwargs)


def test_route_requests_rejects_duplicate_names_and_bad_requests():
    with pytest.raises(ValueError):
        route_requests([PrefixRequest("a", 0, "p", 1, 1, 1)] * 2, 1, "max-hit", MODEL)
    with pytest.raises(ValueError):
        PrefixRequest("a", -1, "p", 1, 1, 1)
    with pytest.raises(ValueError):
        ReplicaModel(prefill_ms_per_token=1.0, decode_ms_per_token=1.0, cache_slots=0)
    with pytest.raises(ValueError):
        route_requests(skewed(5), 2, "max-hit", MODEL).completion_percentile_ms(0)


def test_tenant_quota_limits_each_tenant_and_releases_once():
    quota = TenantQuota(2)
    assert quota.try_acquire("acme", "r1") and quota.try_acquire("acme", "r2")
    assert not quota.try_acquire("acme", "r3")
    assert quota.try_acquire("globex", "g1")
    assert quota.in_flight("acme") == 2 and quota.in_flight("nobody") == 0
    assert quota.release("r1") and not quota.release("r1")
    assert quota.try_acquire("acme", "r3")
    with pytest.raises(ValueError):
        quota.try_acquire("acme", "r3")
    with pytest.raises(ValueError):
        TenantQuota(0)


# ----------------------------------------------------------------------------------------------- viz.kv


def forked_pool():
    alloc = BlockAllocator(num_blocks=8, block_size=4, enable_prefix_caching=False)
    alloc.allocate_prompt("parent", list(range(1, 11)))
    alloc.fork("parent", "child")
    return alloc


def test_pool_figure_draws_every_block_and_table_entry():
    snap = forked_pool().inspect().snapshot()
    fig = kv_viz.pool_figure(snap, title="fork")
    pool, tables = fig.data[0], fig.data[1]
    assert len(pool.x) == 8 and len(tables.x) == 6
    shared = [i for i, c in enumerate(pool.marker.color) if c == kv_viz.SHARED_COLOR]
    assert shared == [0, 1, 2]  # all three parent blocks are shared after the fork
    assert list(fig.layout.yaxis2.ticktext) == ["parent", "child"]


def test_pool_figure_marks_cached_free_blocks():
    alloc = BlockAllocator(num_blocks=4, block_size=2)
    alloc.allocate_prompt("a", [1, 2, 3])
    alloc.free("a")
    colours = kv_viz.pool_figure(alloc.inspect().snapshot()).data[0].marker.color
    assert colours[:2].count(kv_viz.CACHED_COLOR) == 1 and kv_viz.FREE_COLOR in colours


def test_pool_slider_figure_has_one_frame_per_snapshot_and_fixed_colours():
    alloc = forked_pool()
    snaps = [alloc.inspect().snapshot()]
    copies = alloc.append_tokens("child", [42])
    snaps.append(alloc.inspect().snapshot())
    fig = kv_viz.pool_slider_figure(snaps, ["0", "1"], titles=["a", "b"], active=1)
    assert [f.name for f in fig.frames] == ["0", "1"]
    assert fig.layout.sliders[0].active == 1
    last_pool = fig.frames[1].data[0]
    dst = copies[0].dst
    assert last_pool.marker.color[dst] == kv_viz.owner_colors(["parent", "child"])["child"]


def test_pool_figure_validates_input():
    with pytest.raises(ValueError):
        kv_viz.pool_figure({"blocks": []})
    with pytest.raises(ValueError):
        kv_viz.pool_figure(forked_pool().inspect().snapshot(), rows=["parent"])
    with pytest.raises(ValueError):
        kv_viz.pool_slider_figure([forked_pool().inspect().snapshot()], ["0", "1"])


def test_owner_colors_are_stable_and_distinct():
    colours = kv_viz.owner_colors(["A", "B", "A", "C"])
    assert list(colours) == ["A", "B", "C"] and len(set(colours.values())) == 3


def test_kv_figures_draw_their_inputs():
    frag = kv_viz.fragmentation_figure([1, 8], [0.0, 0.1], [0.0, 0.12])
    assert list(frag.data[0].y) == [0.0, 10.0]
    rows = [{"mode": "recompute", "freed": 3, "moved": 0}, {"mode": "swap", "freed": 3, "moved": 96}]
    pre = kv_viz.preemption_figure(rows, {"freed": "blocks freed", "moved": "KiB moved"})
    assert len(pre.data) == 2 and list(pre.data[1].y) == [0, 96]
    shift = kv_viz.distribution_shift_figure(["a", "b"], [0.6, 0.4], [0.5, 0.5], dropped=4, distance=0.1)
    assert "0.1000" in shift.layout.title.text and shift.layout.yaxis.range[1] == pytest.approx(0.66)
    probe = kv_viz.ttft_probe_figure({"miss": [30.0, 31.0], "hit": [8.0]})
    assert [t.name for t in probe.data] == ["miss", "hit"]
    results = [route_requests(skewed(50), 2, p, MODEL) for p in ROUTING_POLICIES]
    route = kv_viz.routing_figure(results)
    assert list(route.data[0].y) == [r.hit_rate for r in results]


def test_kv_figures_reject_mismatched_inputs():
    with pytest.raises(ValueError):
        kv_viz.fragmentation_figure([1, 2], [0.1], [0.1, 0.2])
    with pytest.raises(ValueError):
        kv_viz.preemption_figure([{"mode": "swap"}], {"freed": "blocks"})
    with pytest.raises(ValueError):
        kv_viz.distribution_shift_figure([], [], [], dropped=1, distance=0.0)
    with pytest.raises(ValueError):
        kv_viz.distribution_shift_figure(["a"], [0.5], [0.4], dropped=1, distance=0.1, y_max=0)
    with pytest.raises(ValueError):
        kv_viz.ttft_probe_figure({"miss": []})
    with pytest.raises(ValueError):
        kv_viz.routing_figure([])


# ----------------------------------------------------------------------------------------------- viz.scheduling


def step(i, prefill=None, decode=None, **kw) -> StepRecord:
    return StepRecord(step=i, start=0.01 * i, end=0.01 * i + 0.008, prefill_tokens=prefill or {},
                      decode_tokens=decode or {}, **kw)


def test_tick_gantt_figure_counts_emit_and_queue_cells():
    reqs = [Request("A", 0, 1), Request("B", 0, 4), Request("C", 0, 1)]
    traces = {p: simulate_batching(reqs, 2, p)[1] for p in ("static", "continuous")}
    fig = sched_viz.tick_gantt_figure(traces)
    emits = [t for t in fig.data if t.name == "emits a token"]
    queued = [t for t in fig.data if t.name == "queued"]
    assert [len(t.x) for t in emits] == [6, 6]  # six tokens served under both policies
    assert [len(t.x) for t in queued] == [4, 1]  # C waits 4 ticks (static) or 1 (continuous)


def test_engine_gantt_figure_places_bars_in_time():
    records = [step(0, prefill={"r0": 5}, admitted=["r0"]), step(1, decode={"r0": 1}),
               step(2, prefill={"r1": 3}, decode={"r0": 1})]
    fig = sched_viz.engine_gantt_figure({"run": records})
    prefill = next(t for t in fig.data if t.name == "prefill")
    decode = next(t for t in fig.data if t.name == "decode")
    assert len(prefill.x) == 2 and len(decode.x) == 2
    assert pytest.approx(list(decode.base)) == [10.0, 20.0]
    by_step = sched_viz.engine_gantt_figure({"run": records}, unit_ms=False)
    assert list(next(t for t in by_step.data if t.name == "decode").base) == [1, 2]
    with pytest.raises(ValueError):
        sched_viz.engine_gantt_figure({"run": []})


def test_batching_gain_figure_draws_both_gains_per_model():
    fig = sched_viz.batching_gain_figure(["tiny", "real"], [2.1, 2.1], [1.5, 1.2])
    steps, time = fig.data
    assert list(steps.x) == ["tiny", "real"] and list(steps.y) == [2.1, 2.1]
    assert list(time.y) == [1.5, 1.2] and fig.layout.barmode == "group"
    with pytest.raises(ValueError):
        sched_viz.batching_gain_figure(["tiny"], [2.1, 2.1], [1.5])


def test_iteration_gantt_figure_and_exercise_numbers():
    scenario = chunked_prefill_scenario()
    trace = simulate_iterations(scenario.requests, scenario.tokens_per_tick, scenario.chunked_budget)
    fig = sched_viz.iteration_gantt_figure(trace, time_range=10)
    assert list(fig.layout.xaxis.range) == [0, 10.2]
    chunks = next(t for t in fig.data if t.name == "prefill chunk")
    assert len(chunks.x) == 4  # 8 prompt tokens in chunks of 2
    with pytest.raises(ValueError):
        sched_viz.iteration_gantt_figure(trace, time_range=0)
    # the chapter's exercise: 12-token prompt, 3 tokens per tick, budget 4
    reqs = [PrefillRequest("S", 0, 0, 8), PrefillRequest("L", 0, 12, 2)]
    plain, cut = simulate_iterations(reqs, 3), simulate_iterations(reqs, 3, 4)
    assert plain.ttft("L") == plain.max_decode_gap() == Fraction(13, 3)
    assert cut.ttft("L") == Fraction(16, 3) and cut.max_decode_gap() == Fraction(4, 3)


def test_static_batching_exercise_numbers():
    reqs = [Request("L", 0, 5), Request("a", 0, 1), Request("b", 0, 1), Request("c", 0, 1)]
    assert simulate_batching(reqs, 2, "static")[0] == {"L": 5, "a": 1, "b": 6, "c": 6}
    assert simulate_batching(reqs, 2, "continuous")[0] == {"L": 5, "a": 1, "b": 2, "c": 3}


def test_chunked_prefill_and_admission_figures():
    fig = sched_viz.chunked_prefill_figure(["off", "64"], [50.0, 20.0], [30.0, 60.0], baseline_ms=10.0)
    assert list(fig.data[0].y) == [50.0, 20.0] and fig.layout.shapes
    with pytest.raises(ValueError):
        sched_viz.chunked_prefill_figure(["off"], [1.0, 2.0], [1.0])
    runs = {"slots": {"running": [2, 2, 1], "waiting": [1, 0, 0], "limit": 2},
            "quota": {"running": [1, 1], "waiting": [0, 0], "held": [1, 0]}}
    adm = sched_viz.admission_limits_figure(runs)
    assert len(adm.data) == 5 and len(adm.layout.shapes) == 1
    with pytest.raises(ValueError):
        sched_viz.admission_limits_figure({"bad": {"running": [1]}})


def test_tick_walkthrough_fills_the_eight_parts_from_records():
    previous = step(4, decode={"r0": 1, "r1": 1}, finished={"r1": "length"}, blocks_free=5)
    record = step(5, prefill={"r2": 6}, decode={"r0": 1}, admitted=["r2"], preempted=["r3"],
                  finished={"r0": "stop"}, blocks_used=4, blocks_free=4)
    walk = sched_viz.tick_walkthrough(record, previous, max_num_batched_tokens=16,
                                      emitted={"r0": " end", "r2": "Hi"})
    assert isinstance(walk, Table) and len(walk.rows) == len(sched_viz.EIGHT_STEPS) == 8
    text = {row[0]: row[1] for row in walk.rows}
    assert "r1" in text[sched_viz.EIGHT_STEPS[0]]
    assert "1 decode + 6 prefill = 7 of 16" in text[sched_viz.EIGHT_STEPS[2]]
    assert "r0 (stop)" in text[sched_viz.EIGHT_STEPS[6]] and "r3" in text[sched_viz.EIGHT_STEPS[7]]
    with pytest.raises(TypeError):
        sched_viz.tick_walkthrough("step", None, max_num_batched_tokens=16, emitted={})


def test_every_builder_returns_a_plotly_figure():
    snap = forked_pool().inspect().snapshot()
    assert isinstance(kv_viz.pool_figure(snap), go.Figure)
    assert isinstance(sched_viz.engine_gantt_figure({"r": [step(0, prefill={"a": 2})]}), go.Figure)


def test_batch_composition_stacks_the_three_kinds_under_the_budget():
    ticks = [{"prefill": 14, "decode": 0, "recomputed": 0}, {"prefill": 0, "decode": 3, "recomputed": 9}]
    fig = sched_viz.batch_composition_figure(ticks, token_budget=16, title="t")
    assert fig.layout.barmode == "stack"
    assert [list(trace.y) for trace in fig.data] == [[14, 0], [0, 3], [0, 9]]
    assert fig.layout.shapes[0].y0 == 16
    with pytest.raises(ValueError, match="recomputed"):
        sched_viz.batch_composition_figure([{"prefill": 1, "decode": 0}], token_budget=4)
