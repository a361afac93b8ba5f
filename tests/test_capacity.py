import math

import pytest

from servelab.metrics import capacity
from servelab.metrics.roofline import ModelShape, prefill_cost

from servelab.metrics.capacity import (
    compute_rate,
    expected_tokens_per_cycle,
    flops_per_token,
    hosted_cost,
    in_flight_quantile,
    kv_bytes_for_tokens,
    kv_bytes_per_request,
    monthly_requests,
    operating_allowances,
    owned_cost,
    peak_arrival_rate,
    replicas_needed,
    requests_in_flight,
    speculative_speedup,
    speculative_time_per_token,
    time_to_last_token,
    to_gb,
    to_gib,
    weight_bytes,
    weight_read_rate,
)

LAYOUT = dict(n_layers=80, n_kv_heads=8, head_dim=128, bytes_per_elem=2)


def test_weight_bytes_decimal_gb():
    assert to_gb(weight_bytes(70e9, 2)) == pytest.approx(140)
    assert to_gb(weight_bytes(70e9, 0.5)) == pytest.approx(35)


def test_kv_cache_worked_examples():
    assert kv_bytes_for_tokens(1, **LAYOUT) == 327_680  # 320 KiB per token
    assert to_gib(kv_bytes_for_tokens(8192, **LAYOUT)) == 2.5
    assert to_gib(kv_bytes_for_tokens(8192, **LAYOUT, n_requests=4)) == 10
    assert to_gib(kv_bytes_for_tokens(8192, **dict(LAYOUT, n_kv_heads=64))) == 20
    per_request = kv_bytes_per_request(4096, 512, **LAYOUT)
    assert to_gib(per_request) == 1.40625
    assert to_gib(48 * per_request) == 67.5


def test_flops_and_latency():
    assert flops_per_token(70e9) == pytest.approx(140e9)
    assert compute_rate(70e9, 40) == pytest.approx(5.6e12)
    assert time_to_last_token(0.2, 100, 50) == pytest.approx(2.18)
    assert time_to_last_token(0.2, 1, 50) == pytest.approx(0.2)


def test_peak_rate_and_replicas():
    rate = peak_arrival_rate(100_000, 16, 8, 0.05)
    assert rate == pytest.approx(14.58, abs=0.005)
    plan = replicas_needed(rate, 4, 0.7)
    assert plan.budget_per_replica == pytest.approx(2.8)
    assert (plan.serving, plan.spare, plan.total) == (6, 1, 7)
    assert replicas_needed(5.6, 4, 0.7, spare=0).total == 2  # exact multiple does not round up


def test_hosted_cost_design_exercise():
    assert monthly_requests() == 3_000_000
    assert operating_allowances()["quality review"] == 17_500
    hosted = hosted_cost()
    assert hosted.line_items["uncached input tokens"] == pytest.approx(2205)
    assert hosted.line_items["cached input tokens"] == pytest.approx(94.5)
    assert hosted.line_items["output tokens"] == pytest.approx(1575)
    assert round(hosted.per_1000_requests, 2) == 7.82
    assert round(hosted.per_1000_useful, 2) == 8.07


def test_owned_cost_design_exercise():
    owned = owned_cost()
    assert owned.line_items["replica hours"] == 30_240
    assert owned.total == 49_840
    assert round(owned.per_1000_requests, 2) == 16.61
    assert owned_cost(replicas=6).total == 49_840 - 6 * 720


def test_assumptions_are_editable():
    no_cache = hosted_cost(cached_input_share=0.0)
    assert no_cache.total > hosted_cost().total
    assert hosted_cost(allowances={}).total == pytest.approx(2205 + 94.5 + 1575)


def test_speculative_arithmetic():
    assert speculative_time_per_token(16, 24, 3) == pytest.approx(40 / 3)
    assert speculative_speedup(20, 16, 24, 3) == pytest.approx(1.5)
    assert speculative_time_per_token(16, 24, 1) == 40
    assert speculative_speedup(20, 16, 24, 1) == pytest.approx(0.5)
    assert expected_tokens_per_cycle(0.8, 4) == pytest.approx(sum(0.8**i for i in range(5)))
    assert expected_tokens_per_cycle(1.0, 4) == 5
    assert expected_tokens_per_cycle(0.0, 4) == 1


@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda: weight_bytes(-1, 2), ValueError, "params"),
        (lambda: weight_bytes(70e9, "2"), TypeError, "bytes_per_param"),
        (lambda: kv_bytes_for_tokens(10, **LAYOUT, n_requests=0), ValueError, "n_requests"),
        (lambda: time_to_last_token(0.2, 0, 50), ValueError, "n_tokens"),
        (lambda: peak_arrival_rate(1000, 25, 8, 0.05), ValueError, "active_hours"),
        (lambda: replicas_needed(10, 4, 1.5), ValueError, "planning_utilization"),
        (lambda: replicas_needed(10, 4, 0.7, spare=-1), ValueError, "spare"),
        (lambda: hosted_cost(cached_input_share=1.2), ValueError, "cached_input_share"),
        (lambda: owned_cost(useful_fraction=0), ValueError, "useful_fraction"),
        (lambda: speculative_time_per_token(16, 24, 0), ValueError, "tokens_advanced"),
        (lambda: expected_tokens_per_cycle(1.1, 4), ValueError, "acceptance_rate"),
        (lambda: expected_tokens_per_cycle(0.5, 2.0), TypeError, "draft_len"),
        (lambda: requests_in_flight(4, 0), ValueError, "service_time_s"),
        (lambda: in_flight_quantile(32, 1.0), ValueError, "quantile"),
    ],
)
def test_bad_inputs(call, exc, word):
    with pytest.raises(exc, match=word):
        call()


def test_weight_read_rate_at_batch_one():
    # 40 tokens/s of a 70B FP16 model reads 5.6 TB/s of weights, whatever its 5.6 TFLOP/s of compute
    assert weight_read_rate(70e9, 2, 40) == pytest.approx(5.6e12)
    assert weight_read_rate(70e9, 0.5, 40) == pytest.approx(weight_read_rate(70e9, 2, 40) / 4)


def test_requests_in_flight_is_littles_law():
    assert requests_in_flight(4, 8) == 32
    assert requests_in_flight(14.58, 8) == pytest.approx(116.64)


def test_in_flight_quantile_is_the_poisson_quantile():
    def cdf(n, mean):
        return sum(math.exp(k * math.log(mean) - mean - math.lgamma(k + 1)) for k in range(n + 1))

    for mean, q in ((32, 0.99), (32, 0.5), (3.5, 0.9), (200, 0.999)):
        n = in_flight_quantile(mean, q)
        assert cdf(n, mean) >= q > cdf(n - 1, mean)
    assert in_flight_quantile(32, 0.99) > 32  # capacity for the mean is short of the tail


def test_cost_splits_usage_and_fixed_parts():
    hosted, owned = hosted_cost(), owned_cost()
    assert hosted.fixed_items == owned.fixed_items == operating_allowances()
    assert hosted.usage_total + hosted.fixed_total == hosted.total
    assert round(hosted.per_1000(hosted.usage_total), 2) == 1.29
    assert round(hosted.per_1000(hosted.fixed_total), 2) == 6.53
    assert set(hosted.line_items) == set(hosted.usage_items) | set(hosted.fixed_items)


# --- planning from measurements -------------------------------------------------------------------


def test_in_flight_exceedance_is_the_tail_of_the_quantile():
    # the quantile is the first n whose tail drops to 1 - q or below
    n = capacity.in_flight_quantile(32, 0.99)
    assert capacity.in_flight_exceedance(32, n) <= 0.01 < capacity.in_flight_exceedance(32, n - 1)
    assert capacity.in_flight_exceedance(2.0, 0) == pytest.approx(1 - math.exp(-2.0))


def test_occupancy_weights_counts_by_time_and_cuts_at_the_window():
    # one request over [0, 4), a second over [1, 3): 1 in flight for 2 s, 2 for 2 s, 0 for 1 s
    occ = capacity.occupancy([(0.0, 4.0), (1.0, 3.0)], 0.0, 5.0)
    assert occ.seconds_at == {0: pytest.approx(1.0), 1: pytest.approx(2.0), 2: pytest.approx(2.0)}
    assert occ.mean == pytest.approx(6.0 / 5.0)
    assert occ.quantile(0.5) == 1 and occ.quantile(0.99) == 2
    assert occ.share_above(1) == pytest.approx(0.4)
    cut = capacity.occupancy([(0.0, 4.0)], 2.0, 3.0)
    assert cut.seconds_at == {1: pytest.approx(1.0)}
    with pytest.raises(ValueError):
        capacity.occupancy([(2.0, 1.0)], 0.0, 5.0)


def test_occupancy_of_a_simulated_run_obeys_littles_law():
    from servelab.metrics.loadsim import poisson_jobs, simulate_server

    records = simulate_server(poisson_jobs(4.0, 400.0, seed=1))
    inside = [r for r in records if r.arrival >= 50.0 and r.finish <= 350.0]
    occ = capacity.occupancy([(r.arrival, r.finish) for r in records], 50.0, 350.0)
    rate = len(inside) / 300.0
    mean_time = sum(r.finish - r.arrival for r in inside) / len(inside)
    assert occ.mean == pytest.approx(capacity.requests_in_flight(rate, mean_time), rel=0.05)


def test_sustained_rate_stops_at_the_first_miss():
    assert capacity.sustained_rate([1, 2, 3, 4], [1.0, 0.99, 0.9, 0.995], 0.99) == 2
    assert capacity.sustained_rate([3, 1, 2], [0.99, 1.0, 1.0], 0.99) == 3  # order does not matter
    with pytest.raises(ValueError):
        capacity.sustained_rate([1, 2], [0.5, 0.4], 0.99)
    with pytest.raises(ValueError):
        capacity.sustained_rate([1, 2], [1.0], 0.99)


def test_headroom_is_the_unused_share_of_the_ceiling():
    assert capacity.headroom(14.0, 5, 4.0) == pytest.approx(0.3)
    assert capacity.headroom(14.0, 3, 4.0) < 0


def test_prefill_attention_flops_grow_with_the_square_of_the_prompt():
    linear, attention = capacity.prefill_flops(70e9, 4096, 80, 64, 128)
    assert linear == pytest.approx(2 * 70e9 * 4096)
    assert attention == pytest.approx(2 * 80 * 64 * 128 * 4096 * 4097)  # causal: L(L+1)/2 pairs per head
    linear2, attention2 = capacity.prefill_flops(70e9, 8192, 80, 64, 128)
    assert linear2 / linear == pytest.approx(2) and attention2 / attention == pytest.approx(4, rel=1e-3)


def test_capacity_and_the_roofline_count_prefill_flops_alike():
    shape = ModelShape(params=10**9, n_layers=16, hidden_size=2048, n_kv_heads=8, head_dim=128, bytes_per_elem=2)
    linear, attention = capacity.prefill_flops(1e9, 512, 16, 16, 128)
    assert linear + attention == pytest.approx(prefill_cost(shape, 512).flops)


def test_breakeven_acceptance_makes_speculation_break_even():
    for cycle_cost, k in ((2.14, 4), (3.32, 4), (1.5, 1), (4.9, 4)):
        a = capacity.breakeven_acceptance(cycle_cost, k)
        assert 0 < a <= 1
        # at the break-even acceptance a cycle buys exactly what it costs: speed-up 1 against plain decoding
        tokens = expected_tokens_per_cycle(a, k)
        assert tokens == pytest.approx(cycle_cost, rel=1e-9)
        assert speculative_speedup(1.0, 0.0, cycle_cost, tokens) == pytest.approx(1.0, rel=1e-9)
        # a little more acceptance pays, a little less does not
        assert expected_tokens_per_cycle(min(1.0, a + 1e-3), k) > cycle_cost
        assert expected_tokens_per_cycle(a - 1e-3, k) < cycle_cost


def test_breakeven_acceptance_is_monotone_in_draft_cost():
    verify, k = 1.5, 4  # a (k + 1)-token verify pass costs 1.5 plain steps; drafts cost c steps each
    costs = [0.0, 0.01, 0.05, 0.1, 0.2, 0.4, 0.8]
    breakeven = [capacity.breakeven_acceptance(verify + k * c, k) for c in costs]
    assert breakeven == sorted(breakeven) and len(set(breakeven)) == len(breakeven)


def test_breakeven_acceptance_edges():
    assert capacity.breakeven_acceptance(1.0, 4) == 0.0  # no dearer than a plain step: pays at any acceptance
    assert capacity.breakeven_acceptance(0.5, 4) == 0.0
    assert capacity.breakeven_acceptance(5.0, 4) == pytest.approx(1.0)  # only perfect acceptance pays
    assert math.isnan(capacity.breakeven_acceptance(5.01, 4))  # nothing pays for this cycle
    # the draft-free case of the formula: k = 1 buys 1 + a tokens, so break-even is cost - 1
    assert capacity.breakeven_acceptance(1.3, 1) == pytest.approx(0.3)


@pytest.mark.parametrize(
    "args, exc, word",
    [
        ((0, 4), ValueError, "cycle_cost"),
        ((-1.0, 4), ValueError, "cycle_cost"),
        ((math.nan, 4), ValueError, "cycle_cost"),
        ((math.inf, 4), ValueError, "cycle_cost"),
        (("2", 4), TypeError, "cycle_cost"),
        ((2.0, -1), ValueError, "draft_len"),
        ((2.0, 4.0), TypeError, "draft_len"),
        ((2.0, True), TypeError, "draft_len"),
    ],
)
def test_breakeven_acceptance_bad_inputs(args, exc, word):
    with pytest.raises(exc, match=word):
        capacity.breakeven_acceptance(*args)
