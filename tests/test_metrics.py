import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.metrics.latency import (
    RequestTiming,
    e2e_identity_holds,
    goodput,
    itl,
    percentile,
    slo_attainment,
    throughputs,
    tpot,
    ttft,
)
from servelab.metrics.roofline import ModelShape, attainable_flops, decode_cost, prefill_cost, ridge_point

EMITS = [0.5, 0.6, 0.8, 0.9]


def test_per_request_definitions():
    assert ttft(0.1, EMITS) == pytest.approx(0.4)
    assert itl(EMITS) == pytest.approx([0.1, 0.2, 0.1])
    assert tpot(EMITS) == pytest.approx(0.4 / 3)
    # TPOT is not total latency / token count
    assert tpot(EMITS) != pytest.approx((0.9 - 0.1) / 4)
    assert itl([1.0]) == []


def test_tpot_needs_two_tokens():
    with pytest.raises(ValueError, match="emit_times"):
        tpot([1.0])


@settings(max_examples=50, deadline=None)
@given(st.floats(0, 10), st.lists(st.floats(0, 5), min_size=1, max_size=20))
def test_e2e_identity(arrival, gaps):
    emits = [arrival + sum(gaps[: i + 1]) for i in range(len(gaps))]
    assert e2e_identity_holds(arrival, emits, tol=1e-9)


def test_emit_before_arrival_is_a_boundary_error():
    with pytest.raises(ValueError, match="arrival"):
        ttft(1.0, [0.5, 2.0])


@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda: ttft(0, []), ValueError, "emit_times"),
        (lambda: itl([2.0, 1.0]), ValueError, "non-decreasing"),
        (lambda: ttft("0", [1.0]), TypeError, "arrival"),
        (lambda: itl("abc"), TypeError, "emit_times"),
        (lambda: e2e_identity_holds(0, [1.0], tol=-1), ValueError, "tol"),
    ],
)
def test_bad_inputs(call, exc, word):
    with pytest.raises(exc, match=word):
        call()


def make(arrival, emits, prompt=10):
    return RequestTiming(arrival, arrival, tuple(emits), emits[-1], prompt)


def test_request_timing_properties():
    r = RequestTiming(0.0, 0.2, (0.5, 0.6, 0.8), 0.85, 7)
    assert r.queue_delay == pytest.approx(0.2)
    assert r.ttft == pytest.approx(0.5)
    assert r.tpot == pytest.approx(0.15)
    assert r.e2e == pytest.approx(0.85)
    assert r.output_tokens == 3
    assert RequestTiming(0, 0, (1.0,), 1.0).tpot is None
    with pytest.raises(ValueError, match="first_scheduled"):
        RequestTiming(1.0, 0.5, (2.0,), 2.0)
    with pytest.raises(ValueError, match="finish"):
        RequestTiming(0.0, 0.0, (2.0,), 1.0)


RECORDS = [
    make(0.0, [0.2, 0.3, 0.4]),  # fast
    make(0.0, [1.5, 1.6, 1.7]),  # TTFT too slow
    make(1.0, [1.1, 1.9, 2.7]),  # TPOT too slow
    make(2.0, [2.1]),  # single token: judged on TTFT only
]


def test_throughputs_three_dimensions():
    t = throughputs(RECORDS, (0.0, 4.0))
    assert t.requests_per_s == pytest.approx(4 / 4)
    assert t.output_tokens_per_s == pytest.approx(10 / 4)
    assert t.total_tokens_per_s == pytest.approx(50 / 4)
    assert throughputs(RECORDS, (0.0, 1.0)).requests_per_s == pytest.approx(1.0)


def test_attainment_is_fraction_goodput_is_rate():
    assert slo_attainment(RECORDS, ttft_slo=0.5, tpot_slo=0.2) == pytest.approx(0.5)
    assert slo_attainment(RECORDS, 0.5, 0.2, deadline=0.3) == pytest.approx(0.25)
    assert goodput(RECORDS, 0.5, 0.2, (0.0, 4.0)) == pytest.approx(2 / 4)
    assert goodput(RECORDS, 0.5, 0.2, (0.0, 4.0), unit="tokens") == pytest.approx(4 / 4)
    # same attainment, twice the window: goodput halves, attainment does not change
    assert goodput(RECORDS, 0.5, 0.2, (0.0, 8.0)) == pytest.approx(2 / 8)
    with pytest.raises(ValueError, match="unit"):
        goodput(RECORDS, 0.5, 0.2, (0.0, 4.0), unit="fraction")
    with pytest.raises(ValueError, match="window"):
        goodput(RECORDS, 0.5, 0.2, (4.0, 0.0))
    with pytest.raises(TypeError, match="records"):
        slo_attainment([1, 2], 0.5, 0.2)


def test_percentile_reports_sample_size_and_flags_small_n():
    values = list(range(1, 101))
    with pytest.warns(UserWarning, match="p99"):
        small = percentile(values[:50], 99)
    assert small.n == 50 and not small.enough_samples
    big = percentile(values, 99)
    assert big.n == 100 and big.enough_samples
    assert big.value == pytest.approx(99.01)
    assert percentile([3.0, 1.0, 2.0], 50).value == 2.0
    with pytest.raises(ValueError, match="q"):
        percentile(values, 100)
    with pytest.raises(ValueError, match="values"):
        percentile([], 50)


def test_ridge_point_seed_value():
    assert ridge_point(312e12, 1.55e12) == pytest.approx(201.3, abs=0.05)
    with pytest.raises(ValueError, match="mem_bandwidth"):
        ridge_point(312e12, 0)


def test_attainable_flops_roof():
    assert attainable_flops(10, 312e12, 1.55e12) == pytest.approx(15.5e12)
    assert attainable_flops(1000, 312e12, 1.55e12) == pytest.approx(312e12)
    with pytest.raises(ValueError, match="intensity"):
        attainable_flops(-1, 1, 1)


MODEL = ModelShape(params=70_000_000_000, n_layers=80, hidden_size=8192, n_kv_heads=8, head_dim=128,
                   bytes_per_elem=2)


def test_prefill_vs_decode_intensity():
    ridge = ridge_point(312e12, 1.55e12)
    pre = prefill_cost(MODEL, prompt_len=2048)
    dec = decode_cost(MODEL, context_len=2048, batch=1)
    assert pre.intensity > ridge > dec.intensity
    assert pre.intensity > 100 * dec.intensity
    # batch-1 decode: about 2P FLOPs over 2P bytes -> intensity near 1 FLOP/byte
    assert dec.intensity == pytest.approx(1.0, rel=0.1)
    intensities = [decode_cost(MODEL, 2048, b).intensity for b in (1, 8, 64, 256)]
    assert intensities == sorted(intensities)


def test_phase_cost_formulas_by_hand():
    tiny = ModelShape(params=100, n_layers=2, hidden_size=8, n_kv_heads=2, head_dim=4, bytes_per_elem=2)
    # kv bytes/token = 2*2*2*4*2 = 64
    pre = prefill_cost(tiny, prompt_len=3)
    assert pre.flops == 2 * 100 * 3 + 2 * 2 * 8 * 3 * 4
    assert pre.bytes == 200 + 3 * 64
    dec = decode_cost(tiny, context_len=5, batch=2)
    assert dec.flops == 2 * (200 + 4 * 2 * 8 * 5)
    assert dec.bytes == 200 + 2 * 5 * 64
    with pytest.raises(ValueError, match="batch"):
        decode_cost(tiny, 5, 0)
    with pytest.raises(TypeError, match="model"):
        prefill_cost("tiny", 3)
    with pytest.raises(ValueError, match="head_dim"):
        ModelShape(1, 1, 1, 1, 0, 1)
    assert math.isfinite(pre.intensity)
