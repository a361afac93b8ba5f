"""The soak benchmark's pieces: the least-squares slope, the RSS reading, and a short run through the bridge."""

from __future__ import annotations

import json

import pytest

from servelab.engine import LLMEngine
from servelab.server.soak import DEFAULT_OUT, FLAT_BYTES_PER_REQUEST, POINTS, rss_bytes, slope_bytes_per_request, soak

from test_engine import config, model, tokenizer  # noqa: F401 (fixtures)


def test_slope_is_the_least_squares_fit():
    assert slope_bytes_per_request([(0, 1000), (10, 1500), (20, 2000)]) == pytest.approx(50.0)
    assert slope_bytes_per_request([(0, 0), (1, 2), (2, 0), (3, 2)]) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="at least 2"):
        slope_bytes_per_request([(1, 5)])
    with pytest.raises(ValueError, match="two different request counts"):
        slope_bytes_per_request([(3, 5), (3, 9)])


def test_rss_is_a_plausible_byte_count():
    assert 2**20 < rss_bytes() < 2**40


def test_a_short_soak_runs_every_request_through_the_bridge(model, tokenizer):
    engine = LLMEngine(model, tokenizer, config(trace_steps=0, ledger_size=10))
    lines: list[str] = []
    result = soak(requests=200, concurrency=4, max_tokens=2, engine=engine, echo=lines.append)
    assert result["finish_reasons"] == {"length": 200}
    assert result["ledger_totals"] == {"requests": 200, "generated_tokens": 400}
    assert [p["requests"] for p in result["rss_bytes"]] == [i * 200 // POINTS for i in range(POINTS + 1)]
    assert len(lines) == 10 and len(engine.ledger) == 10
    assert result["load"]["ledger_size"] == 10 and result["hardware"]["cores"] >= 1
    assert result["flat"] == (abs(result["slope_bytes_per_request_second_half"]) < result["flat_criterion_bytes_per_request"])


def test_soak_refuses_bad_sizes(model, tokenizer):
    with pytest.raises(ValueError, match="requests"):
        soak(requests=10, engine=LLMEngine(model, tokenizer, config()))
    with pytest.raises(ValueError, match="concurrency"):
        soak(requests=100, concurrency=0, engine=LLMEngine(model, tokenizer, config()))
    with pytest.raises(ValueError, match="concurrency"):  # above ServerConfig.max_waiting: the bridge refuses
        soak(requests=100, concurrency=65, engine=LLMEngine(model, tokenizer, config()))


def test_the_committed_soak_is_flat_by_its_own_points():
    saved = json.loads(DEFAULT_OUT.read_text())
    points = [(p["requests"], p["rss"]) for p in saved["rss_bytes"]]
    requests = saved["load"]["requests"]
    assert points[-1][0] == requests == saved["ledger_totals"]["requests"] == saved["finish_reasons"]["length"]
    slope = slope_bytes_per_request([p for p in points if p[0] >= requests // 2])
    assert slope == pytest.approx(saved["slope_bytes_per_request_second_half"])
    assert saved["flat"] and abs(slope) < FLAT_BYTES_PER_REQUEST
    assert saved["hardware"]["cpu"] and saved["hardware"]["torch"]
