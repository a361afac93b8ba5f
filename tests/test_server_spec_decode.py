"""Speculative decoding through the server, end to end on the shipped model: a server started from
the command line's ``--speculative-config`` answers greedy completions and chat completions
(streamed and not, JSON-schema included) token for token as a server without it; ``/metrics``
counts drafts with vLLM's ``spec_decode_*`` names on a copy-heavy prompt; a bad
``--speculative-config`` exits with a message naming the key, no traceback; a client's bad request
still gets a 4xx; nothing leaks."""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import jsonschema
import pytest
import torch

from servelab.engine import LLMEngine
from servelab.loadgen import metrics_url, parse_metrics
from servelab.server import BackgroundServer, ServerConfig
from servelab.server.__main__ import build_parser, engine_kwargs

torch.set_num_threads(1)

MODEL = "shakespeare"
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}
COPY_HEAVY = "KING HENRY V:\nI will not be a man, and I will not.\n\n" * 2  # the model loops on it
ENGINE = {"num_blocks": 128, "block_size": 8, "max_num_seqs": 8}


def start(argv: list[str]) -> BackgroundServer:
    """The shipped model behind a server, built as ``python -m servelab.server`` builds it."""
    flags = engine_kwargs(build_parser().parse_args(argv))
    engine = LLMEngine.from_pretrained(None, **(ENGINE | flags))
    return BackgroundServer(engine, ServerConfig(model_name=MODEL))


@pytest.fixture(scope="module")
def servers():
    with start([]) as plain, start(["--speculative-config", json.dumps(SPEC)]) as spec:
        yield plain, spec


def post(server, path: str, body: dict) -> tuple[int, object]:
    """POST ``body`` (plus the model name): the status and the JSON answer, or the SSE payloads."""
    request = urllib.request.Request(server.url + path,
                                     json.dumps({"model": MODEL} | body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            text = resp.read().decode()
            if body.get("stream"):
                return resp.status, [json.loads(line[6:]) for line in text.split("\n")
                                     if line.startswith("data: ") and line != "data: [DONE]"]
            return resp.status, json.loads(text)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def both(servers, path: str, body: dict) -> tuple[object, object]:
    """The same request to the plain and the speculating server; both must answer 200."""
    (status_a, a), (status_b, b) = (post(server, path, body) for server in servers)
    assert status_a == status_b == 200, (a, b)
    return a, b


def streamed_text(events: list[dict], chat: bool) -> str:
    choices = [e["choices"][0] for e in events if e["choices"]]
    return "".join((c["delta"].get("content") or "") if chat else c["text"] for c in choices)


def test_greedy_completions_equal_the_plain_servers_token_for_token(servers):
    for prompt in (COPY_HEAVY, "ROMEO:\nBut soft, what light"):
        body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                "logprobs": 1}
        a, b = both(servers, "/completions", body)
        tokens_a, tokens_b = (x["choices"][0]["logprobs"] for x in (a, b))
        assert tokens_b["tokens"] == tokens_a["tokens"] and len(tokens_a["tokens"]) == 40
        assert tokens_b["token_logprobs"] == pytest.approx(tokens_a["token_logprobs"], abs=1e-4)
        assert b["choices"][0]["text"] == a["choices"][0]["text"] and b["usage"] == a["usage"]
        streams = both(servers, "/completions", body | {"stream": True, "logprobs": None})
        assert [streamed_text(x, chat=False) for x in streams] == [a["choices"][0]["text"]] * 2


def test_greedy_chat_equals_the_plain_servers_streamed_and_not(servers):
    messages = [{"role": "user", "content": COPY_HEAVY}]
    body = {"messages": messages, "max_tokens": 40, "temperature": 0}
    a, b = both(servers, "/chat/completions", body)
    (choice_a,), (choice_b,) = a["choices"], b["choices"]
    assert choice_b["message"] == choice_a["message"] and choice_a["message"]["content"]
    assert choice_b["finish_reason"] == choice_a["finish_reason"] and b["usage"] == a["usage"]
    streams = both(servers, "/chat/completions", body | {"stream": True})
    assert [streamed_text(x, chat=True) for x in streams] == [choice_a["message"]["content"]] * 2


def test_json_schema_chat_with_speculation_is_valid_and_equals_plain(servers):
    schema = {"type": "object", "properties": {"speaker": {"enum": ["KING HENRY V", "ROMEO"]},
                                               "line": {"type": "string", "maxLength": 40}},
              "required": ["speaker", "line"], "additionalProperties": False}
    content = COPY_HEAVY + json.dumps({"speaker": "KING HENRY V", "line": "I will not be a man"})
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 60, "temperature": 0,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "line", "schema": schema}}}
    spec = servers[1]
    drafts_before = spec.call(lambda e: e.stats().spec_decoding.num_drafts)
    a, b = both(servers, "/chat/completions", body)
    assert b["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(b["choices"][0]["message"]["content"]), schema)
    assert spec.call(lambda e: e.stats().spec_decoding.num_drafts) > drafts_before  # it drafted


def test_metrics_count_drafts_with_vllms_names(servers):
    plain, spec = servers
    both(servers, "/completions", {"prompt": COPY_HEAVY, "max_tokens": 32, "temperature": 0,
                                   "ignore_eos": True})
    scraped = {}
    for name, server in (("plain", plain), ("spec", spec)):
        with urllib.request.urlopen(metrics_url(server.url), timeout=10) as resp:
            scraped[name] = parse_metrics(resp.read().decode())
    metrics = scraped["spec"]
    drafts = metrics.value("servelab:spec_decode_num_drafts_total", model_name=MODEL)
    drafted = metrics.value("servelab:spec_decode_num_draft_tokens_total", model_name=MODEL)
    accepted = metrics.value("servelab:spec_decode_num_accepted_tokens_total", model_name=MODEL)
    per_pos = [metrics.value("servelab:spec_decode_num_accepted_tokens_per_pos_total",
                             model_name=MODEL, position=str(i))
               for i in range(SPEC["num_speculative_tokens"])]
    assert 0 < drafts <= drafted <= SPEC["num_speculative_tokens"] * drafts
    assert 0 < accepted <= drafted and per_pos[0] > 0 and sum(per_pos) == accepted
    assert per_pos == sorted(per_pos, reverse=True)  # a draft reaches position i only through i - 1
    assert not any(name.startswith("servelab:spec_decode") for name, _ in scraped["plain"].samples)


def test_a_clients_bad_request_still_gets_a_4xx(servers):
    _, spec = servers
    for body in ({"prompt": "x", "max_tokens": -1}, {"prompt": "x", "temperature": "hot"},
                 {"prompt": "x", "response_format": {"type": "yaml"}}):
        status, answer = post(spec, "/completions", body)
        assert 400 <= status < 500, (body, answer)
    assert spec.call(lambda e: e.has_unfinished()) is False
    assert spec.call(lambda e: (e.allocator.num_used_blocks, e.slots.in_use)) == (0, 0)
    spec.call(lambda e: e.allocator.inspect().check_invariants())


@pytest.mark.parametrize("value, key", [
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"method": "eagle3", "num_speculative_tokens": 2}', "method"),
])
def test_a_bad_speculative_config_exits_with_a_message_naming_the_key(value, key):
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "servelab.server", "--port", "0", "--speculative-config", value]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)  # loaded CI
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "--speculative-config" in done.stderr and key in done.stderr
