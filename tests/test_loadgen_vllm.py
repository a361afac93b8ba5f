"""servelab.loadgen speaks `vllm bench serve`: gamma arrivals, its datasets, its flags and their errors, and its
result JSON, whose every summary figure a test recomputes from the saved per-request arrays; the vllm-style
command line against the course server on 127.0.0.1, and the course's own command line giving the same plan."""

import json
import math

import numpy as np
import pytest

from servelab.loadgen import (bench_summary, custom_samples, gamma_arrivals, load_samples, percentile_key,
                              random_samples, sharegpt_samples)
from servelab.loadgen.__main__ import main as loadgen_main
from tiny_server import tiny_course_server

# ------------------------------------------------------------------------------------------ arrivals


def test_gamma_arrivals_hold_the_rate_and_burstiness_sets_the_spread():
    rng = np.random.default_rng
    for burstiness in (0.25, 1.0, 4.0):
        t = gamma_arrivals(5.0, 4000, burstiness, rng(0))
        assert t[-1] == pytest.approx(4000 / 5.0) and all(b >= a for a, b in zip(t, t[1:]))
        gaps = np.diff([0.0, *t])
        # gamma with shape k: coefficient of variation 1/sqrt(k) (1 for Poisson)
        assert np.std(gaps) / np.mean(gaps) == pytest.approx(1 / math.sqrt(burstiness), rel=0.1)
    assert gamma_arrivals(5.0, 50, 1.0, rng(3)) == gamma_arrivals(5.0, 50, 1.0, rng(3))
    assert gamma_arrivals(math.inf, 3, 1.0, rng(0)) == [0.0, 0.0, 0.0]
    assert gamma_arrivals(4.0, 4, math.inf, rng(0)) == pytest.approx([0.25, 0.5, 0.75, 1.0])


@pytest.mark.parametrize("kwargs, needle", [
    ({"rate": 0.0}, "rate must be a number > 0"), ({"burstiness": -1.0}, "burstiness must be a number > 0"),
    ({"count": 0}, "count"),
])
def test_gamma_arrivals_name_bad_arguments(kwargs, needle):
    args = {"rate": 1.0, "count": 3, "burstiness": 1.0} | kwargs
    with pytest.raises(ValueError, match=needle):
        gamma_arrivals(args["rate"], args["count"], args["burstiness"], np.random.default_rng(0))


# ------------------------------------------------------------------------------------------ datasets


def test_random_dataset_draws_lengths_uniformly_around_the_means():
    samples = random_samples(2000, 20, 10, 0.5, seed=1)
    words = [len(s.prompt.split()) for s in samples]
    outs = [s.output_len for s in samples]
    assert (min(words), max(words)) == (10, 30) and (min(outs), max(outs)) == (5, 15)
    assert np.mean(words) == pytest.approx(20, abs=0.5)
    assert random_samples(5, 8, 4, 0.0, seed=2) == random_samples(5, 8, 4, 0.0, seed=2)
    assert {s.output_len for s in random_samples(5, 8, 4, 0.0, seed=2)} == {4}


def write_sharegpt(path):
    turn = [{"from": "human", "value": "tell me a story about a king"},
            {"from": "gpt", "value": "once there was a king"}]
    data = [{"id": "a", "conversations": turn},
            {"id": "one turn", "conversations": turn[:1]},
            {"id": "short prompt", "conversations": [{"from": "human", "value": "hi"}, turn[1]]},
            {"id": "short reply", "conversations": [turn[0], {"from": "gpt", "value": "no"}]},
            {"id": "b", "conversations": [{"from": "human", "value": "what light through yonder window"},
                                          {"from": "gpt", "value": "it is the east and juliet is the sun"}, turn[0]]}]
    path.write_text(json.dumps(data))
    return path


def test_sharegpt_keeps_two_turn_pairs_shuffles_and_tops_up(tmp_path):
    path = write_sharegpt(tmp_path / "sharegpt.json")
    samples = sharegpt_samples(path, 2, seed=0, shuffle=False)
    assert [(s.prompt, s.output_len) for s in samples] == [("tell me a story about a king", 5),
                                                           ("what light through yonder window", 9)]
    topped = sharegpt_samples(path, 7, seed=0)
    assert len(topped) == 7 and {s.prompt for s in topped} == {s.prompt for s in samples}
    assert {s.output_len for s in sharegpt_samples(path, 3, seed=0, output_len=12)} == {12}
    # the output-length override lifts the minimum-reply filter, as in vLLM
    assert len({s.prompt for s in sharegpt_samples(path, 9, seed=0, output_len=12)}) == 2
    shuffles = {tuple(s.prompt for s in sharegpt_samples(path, 2, seed=k)) for k in range(8)}
    assert len(shuffles) == 2


def test_custom_jsonl_with_optional_output_tokens(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "to be or not to be"}\n\n{"prompt": "all the world", "output_tokens": 3}\n')
    samples = custom_samples(path, 2, seed=0, output_len=7, shuffle=False)
    assert [(s.prompt, s.output_len) for s in samples] == [("to be or not to be", 7), ("all the world", 3)]


@pytest.mark.parametrize("content, needle", [
    ('{"prompt": "a"}\nnot json\n', "line 2 is not JSON"),
    ('{"text": "a"}\n', 'line 1 needs a non-empty string "prompt"'),
    ('{"prompt": "a", "output_tokens": 0}\n', '"output_tokens" must be an int >= 1'),
    ("\n", "holds no usable entry"),
])
def test_custom_jsonl_errors_name_the_line(tmp_path, content, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=needle):
        custom_samples(path, 2, seed=0)


@pytest.mark.parametrize("kwargs, needle", [
    ({"name": "sonnet"}, "--dataset-name must be one of random, sharegpt, custom"),
    ({"name": "random", "path": "x.json"}, "takes no --dataset-path"),
    ({"name": "sharegpt"}, "--dataset-name sharegpt needs --dataset-path"),
    ({"name": "sharegpt", "path": "/nonexistent/sharegpt.json"}, "not a readable ShareGPT JSON"),
    ({"name": "random", "random_range_ratio": 1.0}, r"--random-range-ratio must be a number in \[0, 1\)"),
])
def test_dataset_errors_name_the_flag(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        load_samples(kwargs.pop("name"), 3, 0, kwargs.pop("path", None), **kwargs)


# ------------------------------------------------------------------------------------------ the summary


def hand_records():
    """Three requests: 4 tokens, 1 token, and a failure; times in seconds."""
    return {"input_lens": [10, 5, 7], "output_lens": [4, 1, 0], "ttfts": [0.1, 0.3, 0.0],
            "itls": [[0.02, 0.04, 0.06], [], []], "latencies": [0.22, 0.3, 0.0], "start_times": [0.0, 0.22, 0.5],
            "errors": ["", "", "HTTP 503: busy"]}


def test_summary_by_hand():
    s = bench_summary(hand_records(), 2.0, ["ttft", "tpot", "itl", "e2el"], [50, 99.9], {"ttft": 200, "tpot": 50})
    assert (s["completed"], s["failed"], s["total_input_tokens"], s["total_output_tokens"]) == (2, 1, 15, 5)
    assert s["request_throughput"] == 1.0 and s["output_throughput"] == 2.5 and s["total_token_throughput"] == 10
    assert s["mean_tpot_ms"] == pytest.approx(40.0)  # (220 - 100) / 3; the one-token request has no TPOT
    assert s["mean_itl_ms"] == pytest.approx(40.0) and s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["p99.9_itl_ms"] == pytest.approx(59.96) and "p50_e2el_ms" in s
    # goodput: the first meets TTFT <= 200 ms and TPOT <= 50 ms; the second misses TTFT (its TPOT counts as 0)
    assert s["request_goodput"] == pytest.approx(0.5)
    # [0, 0.22) and [0.22, 0.52) touch but do not overlap
    assert s["max_concurrent_requests"] == 1 and s["max_output_tokens_per_s"] == 5.0
    assert percentile_key(99.0, "ttft") == "p99_ttft_ms" and percentile_key(99.9, "ttft") == "p99.9_ttft_ms"
    assert bench_summary(hand_records(), 2.0)["request_goodput"] is None


# ------------------------------------------------------------------------------------------ command line


def test_bad_flag_values_are_named(capsys):
    cases = [(["--dataset-name", "sonnet"], "--dataset-name: invalid choice: 'sonnet'"),
             (["--percentile-metrics", "ttft,p99"], "--percentile-metrics takes a comma-separated list of ttft"),
             (["--metric-percentiles", "50,101"], "--metric-percentiles takes comma-separated numbers in [0, 100]"),
             (["--burstiness", "0"], "--burstiness: must be a number > 0 or inf"),
             (["--max-concurrency", "0"], "--max-concurrency/--concurrency: must be an integer >= 1"),
             (["--backend", "tgi"], "--backend: invalid choice: 'tgi'")]
    for argv, needle in cases:
        with pytest.raises(SystemExit) as stop:
            loadgen_main(["--url", "http://127.0.0.1:9/v1", "--model", "m", *argv])
        assert stop.value.code == 2 and needle in capsys.readouterr().err, argv


@pytest.mark.parametrize("argv, needle", [
    (["--goodput", "ttft:100", "queue:5"], "--goodput takes KEY:MS pairs with KEY one of ttft, tpot, e2el"),
    (["--request-rate", "2", "--rate", "2"], "--request-rate is vLLM's open loop"),
    (["--endpoint", "/v1/embeddings"], "--endpoint must end in /completions or /chat/completions"),
    (["--backend", "openai-chat"], "--backend openai-chat does not match --endpoint /v1/completions"),
    (["--dataset-name", "custom"], "--dataset-name custom needs --dataset-path"),
])
def test_bad_combinations_stop_before_sending(argv, needle):
    # port 9 (discard) on loopback: nothing listens, so a request sent by mistake would fail loudly
    with pytest.raises(SystemExit, match=needle):
        loadgen_main(["--base-url", "http://127.0.0.1:9", "--model", "m", "--num-prompts", "2", *argv])


# ------------------------------------------------------------------------------------------ against our server


@pytest.fixture(scope="module")
def course_server():
    with tiny_course_server() as server:
        yield server


def recompute(result: dict, metrics, percentiles, goodput_ms: dict) -> dict:
    """Every summary figure again, from the per-request arrays alone (independently of bench_summary)."""
    ok = [i for i, e in enumerate(result["errors"]) if e == ""]
    duration = result["duration"]
    ttft = np.array([result["ttfts"][i] for i in ok])
    e2el = np.array([result["latencies"][i] for i in ok])
    n_out = np.array([result["output_lens"][i] for i in ok])
    tpot_all = np.where(n_out > 1, (e2el - ttft) / np.maximum(n_out - 1, 1), 0.0)
    values = {"ttft": ttft, "e2el": e2el, "tpot": tpot_all[n_out > 1],
              "itl": np.array([g for i in ok for g in result["itls"][i]])}
    n_in = sum(result["input_lens"][i] for i in ok)
    good = np.ones(len(ok), bool)
    for name, ms in goodput_ms.items():
        good &= {"ttft": ttft, "tpot": tpot_all, "e2el": e2el}[name] <= ms / 1000
    spans = sorted((result["start_times"][i], result["start_times"][i] + result["latencies"][i]) for i in ok)
    peak = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    out = {"completed": len(ok), "failed": len(result["errors"]) - len(ok), "total_input_tokens": n_in,
           "total_output_tokens": int(n_out.sum()), "request_throughput": len(ok) / duration,
           "output_throughput": n_out.sum() / duration, "total_token_throughput": (n_in + n_out.sum()) / duration,
           "request_goodput": good.sum() / duration, "max_concurrent_requests": peak}
    for m in metrics:
        ms = values[m] * 1000
        out |= {f"mean_{m}_ms": ms.mean(), f"median_{m}_ms": np.median(ms), f"std_{m}_ms": ms.std()}
        out |= {f"p{p:g}_{m}_ms": np.percentile(ms, p) for p in percentiles}
    return out


VLLM_FLAGS = ["--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "6",
              "--random-range-ratio", "0.5", "--num-prompts", "12", "--seed", "3"]


def test_vllm_command_line_writes_a_result_its_records_reproduce(course_server, tmp_path, capsys):
    root = course_server.url.removesuffix("/v1")
    loadgen_main(["--backend", "vllm", "--base-url", root, "--endpoint", "/v1/completions", "--model", "tiny",
                  *VLLM_FLAGS, "--request-rate", "40", "--burstiness", "0.5", "--max-concurrency", "3",
                  "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
                  "--goodput", "ttft:2000", "tpot:500", "e2el:5000", "--ignore-eos", "--save-result",
                  "--save-detailed", "--result-dir", str(tmp_path / "results"), "--result-filename", "run.json"])
    assert "Serving Benchmark Result" in capsys.readouterr().out
    result = json.loads((tmp_path / "results" / "run.json").read_text())
    assert result["completed"] == 12 and result["errors"] == [""] * 12, result["errors"]
    assert (result["backend"], result["request_rate"], result["burstiness"], result["max_concurrency"]) == \
        ("vllm", 40.0, 0.5, 3)
    bounds = {"ttft": 2000, "tpot": 500, "e2el": 5000}
    expected = recompute(result, ["ttft", "tpot", "itl", "e2el"], [50, 90, 99], bounds)
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    # ignore_eos honoured: each request produced exactly the max_tokens the seeded plan asked for
    plan = random_samples(12, 8, 6, 0.5, seed=3)
    assert result["output_lens"] == [s.output_len for s in plan]
    assert 1 <= result["max_concurrent_requests"] <= 3  # the cap held
    assert all(len(itl) == n - 1 for itl, n in zip(result["itls"], result["output_lens"]))


def test_without_save_detailed_the_arrays_stay_out_and_the_model_is_discovered(course_server, tmp_path):
    loadgen_main(["--url", course_server.url, *VLLM_FLAGS, "--save-result", "--result-dir", str(tmp_path)])
    (path,) = tmp_path.iterdir()
    assert path.name.startswith("openai-infqps-tiny-") and path.suffix == ".json"  # vLLM's default file name
    result = json.loads(path.read_text())
    assert result["model_id"] == "tiny" and result["request_goodput"] is None
    assert not {"ttfts", "itls", "input_lens", "output_lens", "generated_texts", "errors"} & result.keys()
    assert {"p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms"} <= result.keys() and "p99_e2el_ms" not in result


def test_the_course_command_line_sends_the_same_plan(course_server, tmp_path, capsys):
    """--closed-loop --concurrency N is vLLM's --request-rate inf --max-concurrency N: the same requests."""
    course = loadgen_main(["--url", course_server.url, "--model", "tiny", "--closed-loop", "--concurrency", "2",
                           *VLLM_FLAGS, "--save-result", "--save-detailed", "--result-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "closed loop, concurrency 2" in out and "steady: 12/12 ok" in out
    vllm = loadgen_main(["--url", course_server.url, "--model", "tiny", "--max-concurrency", "2", *VLLM_FLAGS,
                         "--save-detailed"])
    for key in ("completed", "total_input_tokens", "total_output_tokens", "input_lens", "output_lens"):
        assert course[key] == vllm[key], key
    assert course["max_concurrency"] == vllm["max_concurrency"] == 2 and course["request_rate"] == "inf"
    assert max(course["max_concurrent_requests"], vllm["max_concurrent_requests"]) <= 2


def test_file_datasets_and_general_lengths_through_the_command_line(course_server, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "ROMEO: what light", "output_tokens": 3}\n{"prompt": "JULIET: o romeo"}\n')
    custom = loadgen_main(["--url", course_server.url, "--dataset-name", "custom", "--dataset-path", str(prompts),
                           "--custom-output-len", "7", "--disable-shuffle", "--ignore-eos", "--num-prompts", "4",
                           "--max-concurrency", "2", "--save-detailed"])
    assert custom["completed"] == 4, custom["errors"]
    assert custom["output_lens"][:2] == [3, 7] and set(custom["output_lens"]) <= {3, 7}
    sharegpt = loadgen_main(["--url", course_server.url, "--dataset-name", "sharegpt", "--dataset-path",
                             str(write_sharegpt(tmp_path / "sharegpt.json")), "--output-len", "5", "--num-prompts",
                             "3", "--save-detailed"])
    # without --ignore-eos (vLLM's default for file datasets) a request may stop early at the end token
    assert sharegpt["completed"] == 3, sharegpt["errors"]
    assert all(1 <= n <= 5 for n in sharegpt["output_lens"])
    general = loadgen_main(["--url", course_server.url, "--input-len", "5", "--output-len", "3", "--num-prompts", "3",
                            "--save-detailed"])
    assert general["output_lens"] == [3, 3, 3], general["errors"]
