"""servelab.server over real HTTP on 127.0.0.1: streamed text equals the engine's offline output, disconnects
free every KV block, overload answers 429/503 with Retry-After, bad input gets a 4xx naming the problem,
deadlines and slow clients end requests without leaks. A small random-weight model keeps it fast on CPU.
Then OpenAI compatibility with the official ``openai`` client (on the shipped model, whose samples vary with
the seed), OpenAI-shaped errors for everything, a hypothesis fuzz of request bodies (never a 5xx), the
Prometheus metrics (a disconnect storm leaves nothing running), and the book's demo functions."""

import asyncio
import contextlib
import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import aiohttp
import openai
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from servelab.engine import EngineConfig, LLMEngine
from servelab.lifecycle.state_machine import RequestState
from servelab.loadgen import histogram_delta, metrics_url, parse_metrics
from servelab.loadgen.scrape import HistogramDelta
from servelab.model import LlamaConfig, LlamaForCausalLM, load_checkpoint, load_tokenizer, train_tokenizer
from servelab.sampling import SamplingParams
from servelab.server import (DEFAULT_MODEL_NAME, BackgroundServer, EngineBridge, IngressGate, Rejection,
                             ServerConfig, TenantLimits, TokenBucket, render_chat)
from servelab.server.bridge import BackpressurePolicy, SlowClient
from servelab.server.demo import course_server, openai_stream, raw_exchange, stream_text, ttft_at_two_boundaries

torch.set_num_threads(1)

MODEL = "tiny"
TEXT = ("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n"
        "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?\nDeny thy father and refuse thy name.\n\n") * 20


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXT, vocab_size=300)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def make_server(model, tokenizer):
    """Start servers on free ports (fresh engine each); close them all after the test."""
    servers = []

    def start(engine_kwargs=None, **config):
        kwargs = {"num_blocks": 64, "block_size": 8, "max_num_seqs": 8} | (engine_kwargs or {})
        engine = LLMEngine(model, tokenizer, EngineConfig(**kwargs))
        server = BackgroundServer(engine, ServerConfig(model_name=MODEL, **config))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def server(make_server):
    return make_server()


def offline_text(model, tokenizer, prompt, params) -> str:
    """What the engine alone produces for one request (a fresh engine, nothing else in the batch)."""
    engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=64, block_size=8))
    return engine.generate([prompt], params)[0].text


def post(server, path, body, headers=None, raw=None):
    """POST and return (status, headers, parsed JSON or SSE events)."""
    async def go():
        async with aiohttp.ClientSession() as session:
            data = raw if raw is not None else json.dumps(body).encode()
            async with session.post(server.url + path, data=data,
                                    headers={"Content-Type": "application/json", **(headers or {})}) as resp:
                text = await resp.text()
                if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                    return resp.status, resp.headers, sse_events(text)
                return resp.status, resp.headers, json.loads(text)
    return asyncio.run(go())


def sse_events(text: str) -> list:
    events = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def assert_engine_clean(server, timeout_s: float = 5.0):
    """Every KV block back in the pool, no reservation, no slot, invariants clean."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = server.call(lambda e: (e.allocator.num_used_blocks, e.allocator.num_reserved_blocks,
                                       e.slots.in_use, e.has_unfinished()))
        if state == (0, 0, 0, False) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert state == (0, 0, 0, False)
    server.call(lambda e: e.allocator.inspect().check_invariants())
    assert server.bridge.num_waiting == 0


# ------------------------------------------------------------------------------------------ output equality


def test_streamed_text_equals_offline_output(server, model, tokenizer):
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=40, seed=7, ignore_eos=True)
    status, _, events = post(server, "/completions", {
        "model": MODEL, "prompt": "ROMEO:\nBut soft", "max_tokens": 40, "temperature": 0.9, "top_p": 0.95,
        "seed": 7, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    streamed = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    assert streamed == offline_text(model, tokenizer, "ROMEO:\nBut soft", params)
    assert len([e for e in events if e["choices"] and e["choices"][0]["text"]]) > 1  # really streamed
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == [] and usage["completion_tokens"] == 40
    assert usage["prompt_tokens"] == len(tokenizer.encode("ROMEO:\nBut soft").ids)
    assert_engine_clean(server)


def test_non_streaming_n2_and_chat_match_offline(server, model, tokenizer):
    status, _, body = post(server, "/completions", {"model": MODEL, "prompt": "JULIET:\n", "max_tokens": 12,
                                                    "seed": 3, "n": 2, "temperature": 1.0, "ignore_eos": True})
    assert status == 200
    for i, choice in enumerate(body["choices"]):
        params = SamplingParams(max_tokens=12, seed=3 + i, ignore_eos=True)
        assert choice["index"] == i and choice["text"] == offline_text(model, tokenizer, "JULIET:\n", params)
    assert body["usage"]["completion_tokens"] == 24
    messages = [{"role": "system", "content": "A play."}, {"role": "user", "name": "ROMEO", "content": "Hark!"}]
    prompt = render_chat(messages)
    assert prompt == "SYSTEM:\nA play.\n\nROMEO:\nHark!\n\nASSISTANT:\n"
    status, _, events = post(server, "/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 30,
                                                           "seed": 5, "stream": True})
    assert status == 200 and events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    expected = offline_text(model, tokenizer, prompt, SamplingParams(max_tokens=30, seed=5, stop=("\n\n",)))
    assert streamed == expected and "usage" not in events[-1]  # no include_usage: no usage event
    assert_engine_clean(server)


def test_models_and_health(server):
    async def go():
        async with aiohttp.ClientSession() as session:
            async with session.get(server.url + "/models") as resp:
                models = await resp.json()
            async with session.get(server.url.removesuffix("/v1") + "/health") as resp:
                return models, resp.status, await resp.json()
    models, status, health = asyncio.run(go())
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 256
    assert status == 200 and health["status"] == "ok"


# ------------------------------------------------------------------------------------------ disconnects


def send_raw(server, body) -> socket.socket:
    """Send a POST /v1/completions on a raw socket (so the test decides when the client goes away)."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def open_stream(server, body) -> socket.socket:
    """Send a streaming request and wait for its first event; the caller closes the socket."""
    sock = send_raw(server, body)
    received = b""
    while b"data: " not in received:
        received += sock.recv(4096)
    return sock


def wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@contextlib.contextmanager
def engine_paused(server):
    """Hold the engine thread between two steps (a stalled engine); yields the number of steps run so far."""
    release, paused_at = threading.Event(), []

    def hold(engine):
        paused_at.append(engine.num_steps)
        release.wait(10)

    holder = threading.Thread(target=server.call, args=(hold,))
    holder.start()
    wait_for(lambda: paused_at)
    try:
        yield paused_at[0]
    finally:
        release.set()
        holder.join()


def test_disconnect_mid_stream_frees_every_block_within_one_step(make_server):
    server = make_server({"trace_steps": 10_000})  # the steps after the cancels are read from the trace
    total = server.call(lambda e: e.allocator.num_free_blocks)
    body = {"model": MODEL, "prompt": "ROMEO:\n" * 5, "max_tokens": 200, "ignore_eos": True, "stream": True}
    sockets = [open_stream(server, body) for _ in range(3)]
    assert server.call(lambda e: e.allocator.num_used_blocks) > 0
    with engine_paused(server) as paused_at:
        for sock in sockets:
            sock.close()
        time.sleep(0.2)  # the handlers notice the disconnects and queue their cancels
    assert_engine_clean(server)
    assert server.call(lambda e: e.allocator.num_free_blocks) == total
    records = server.call(lambda e: e.ledger.records)
    assert [r.state for r in records] == [RequestState.CANCELLED] * 3
    later_steps = server.call(lambda e: list(e.trace)[paused_at:])
    for record in records:  # at most the one step already decided when the cancels arrived
        assert sum(record.request_id in step.decode_tokens for step in later_steps) <= 1


def test_disconnect_while_queued_frees_the_queue_slot(server):
    with engine_paused(server):
        queued = send_raw(server, {"model": MODEL, "prompt": "ROMEO:\n", "max_tokens": 5, "stream": True})
        wait_for(lambda: server.bridge.num_waiting == 1)
        queued.close()
        time.sleep(0.1)  # the handler notices the disconnect and sends its cancel behind the add
    assert_engine_clean(server)
    assert [r.state for r in server.call(lambda e: e.ledger.records)] == [RequestState.CANCELLED]


# ------------------------------------------------------------------------------------------ overload


def test_full_queue_answers_503_with_retry_after(make_server):
    server = make_server(max_waiting=1)
    with engine_paused(server):
        queued = send_raw(server, {"model": MODEL, "prompt": "JULIET:\n", "max_tokens": 5})
        wait_for(lambda: server.bridge.num_waiting == 1)
        status, headers, body = post(server, "/completions", {"model": MODEL, "prompt": "x", "max_tokens": 5})
    assert status == 503 and int(headers["Retry-After"]) >= 1
    assert body["error"]["code"] == "overloaded" and "queue is full" in body["error"]["message"]
    assert b" 200 OK" in queued.recv(4096)  # the queued one is served once the engine runs again
    queued.close()
    assert_engine_clean(server)


def test_queueing_deadline_answers_503(make_server):
    server = make_server(queue_timeout_s=0.2)
    with engine_paused(server):
        queued = send_raw(server, {"model": MODEL, "prompt": "JULIET:\n", "max_tokens": 5})
        wait_for(lambda: server.bridge.num_waiting == 1)
        time.sleep(0.3)
    reply = queued.recv(4096).decode()
    assert " 503 " in reply and "Retry-After: " in reply and "queueing deadline" in reply
    queued.close()
    assert_engine_clean(server)


def test_request_that_would_miss_its_deadline_is_refused(server):
    server.bridge.queue_delay_ewma_s = 2.0  # as if recent requests queued for 2 s
    with engine_paused(server):
        queued = send_raw(server, {"model": MODEL, "prompt": "JULIET:\n", "max_tokens": 5})
        wait_for(lambda: server.bridge.num_waiting == 1)
        status, headers, body = post(server, "/completions", {"model": MODEL, "prompt": "x", "deadline_s": 0.5})
        assert status == 503 and int(headers["Retry-After"]) == 2 and "deadline" in body["error"]["message"]
    assert b" 200 OK" in queued.recv(4096)
    queued.close()
    assert_engine_clean(server)


def test_engine_crash_fails_requests_and_health(make_server):
    server = make_server()

    def broken_step():
        raise RuntimeError("device lost")

    server.engine.step = broken_step
    status, _, body = post(server, "/completions", {"model": MODEL, "prompt": "x"})
    assert status == 500 and "device lost" in body["error"]["message"]
    status, _, body = post(server, "/completions", {"model": MODEL, "prompt": "x"})
    assert status == 503 and "not running" in body["error"]["message"]

    async def health():
        async with aiohttp.ClientSession() as session:
            async with session.get(server.url.removesuffix("/v1") + "/health") as resp:
                return resp.status, await resp.json()
    status, body = asyncio.run(health())
    assert status == 503 and "device lost" in body["detail"]


def test_rate_limit_quota_and_api_keys(make_server):
    server = make_server(api_keys={"sk-a": "alice", "sk-b": "bob"},
                         tenant_limits=TenantLimits(requests_per_s=0.5, burst=2),
                         per_tenant_limits={"bob": TenantLimits(requests_per_s=50, burst=50, token_quota=10)})
    body = {"model": MODEL, "prompt": "ROMEO:\n", "max_tokens": 4, "ignore_eos": True}
    assert post(server, "/completions", body)[0] == 401
    status, _, err = post(server, "/completions", body, {"Authorization": "Bearer nope"})
    assert status == 401 and err["error"]["type"] == "authentication_error"
    alice = {"Authorization": "Bearer sk-a"}
    assert [post(server, "/completions", body, alice)[0] for _ in range(2)] == [200, 200]
    status, headers, err = post(server, "/completions", body, alice)
    assert status == 429 and err["error"]["type"] == "rate_limit_error" and int(headers["Retry-After"]) >= 1
    bob = {"Authorization": "Bearer sk-b"}
    status, _, ok = post(server, "/completions", body, bob)  # 3 prompt + 4 generated tokens
    assert status == 200 and server.gate.used_tokens("bob") == ok["usage"]["total_tokens"]
    assert post(server, "/completions", body, bob)[0] == 200  # 7 < 10: still inside the quota
    status, headers, err = post(server, "/completions", body, bob)
    assert status == 429 and err["error"]["code"] == "quota_exceeded" and int(headers["Retry-After"]) > 3000


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("body, status, needle", [
    ({"prompt": "x"}, 400, "model is required"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "does not exist"),
    ({"model": MODEL}, 400, "prompt must be a non-empty string"),
    ({"model": MODEL, "prompt": ""}, 400, "prompt"),
    ({"model": MODEL, "prompt": "x", "temperature": 3}, 400, "temperature"),
    ({"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"model": MODEL, "prompt": "x", "top_k": 2.5}, 400, "top_k"),
    ({"model": MODEL, "prompt": "x", "min_p": 1.5}, 400, "min_p"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "n": 99}, 400, "n must be"),
    ({"model": MODEL, "prompt": "x", "seed": -1}, 400, "seed"),
    ({"model": MODEL, "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"model": MODEL, "prompt": "x", "logprobs": 6}, 400, "logprobs must be an integer in [0, 5]"),
    ({"model": MODEL, "prompt": "x", "tools": [{"type": "function"}]}, 400, "not trained to call tools"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 256}, 400, "context limit of 256"),
    ({"model": MODEL, "prompt": "ROMEO " * 300, "max_tokens": 1}, 400, "context limit"),
    ({"model": MODEL, "prompt": "x", "deadline_s": 1e9}, 400, "deadline_s"),
])
def test_bad_requests_get_4xx_with_a_clear_message(server, body, status, needle):
    got, _, err = post(server, "/completions", body)
    assert got == status and needle in err["error"]["message"]


def test_malformed_chat_and_bodies(server):
    for raw, needle in ((b"{not json", "not valid JSON"), (b"[1, 2]", "JSON object")):
        status, _, err = post(server, "/completions", None, raw=raw)
        assert status == 400 and needle in err["error"]["message"]
    robot = {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}
    status, _, err = post(server, "/chat/completions", robot)
    assert status == 400 and "role" in err["error"]["message"]
    huge = json.dumps({"model": MODEL, "prompt": "x" * 70000}).encode()
    status, _, err = post(server, "/completions", None, raw=huge)
    assert status == 413 and "exceeds" in err["error"]["message"]
    assert_engine_clean(server)


# ------------------------------------------------------------------------------------------ deadlines, slow clients


def test_deadline_ends_request_as_timed_out(server):
    body = {"model": MODEL, "prompt": "ROMEO:\n", "max_tokens": 240, "ignore_eos": True, "deadline_s": 0.05}
    status, _, err = post(server, "/completions", body)
    assert status == 504 and err["error"]["code"] == "timeout"
    sock = open_stream(server, body | {"stream": True, "deadline_s": 0.5})
    with engine_paused(server):
        time.sleep(0.6)  # the deadline passes mid-stream; the next step ends the request
    received = b""
    while b"[DONE]" not in received:
        received += sock.recv(65536)
    sock.close()
    assert b'"code": "timeout"' in received.split(b"data: ")[-2]  # the last event before [DONE]
    assert_engine_clean(server)
    states = [r.state for r in server.call(lambda e: e.ledger.records)]
    assert states == [RequestState.TIMED_OUT] * 2


def test_slow_reader_is_backpressured_then_resumed(model, tokenizer):
    engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=64, block_size=8))
    bridge = EngineBridge(engine, stream_capacity=3, backpressure_timeout_s=30.0)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompt = tokenizer.encode("ROMEO:\n").ids

    async def go():
        bridge.start(asyncio.get_running_loop())
        stream = bridge.submit(prompt, params)
        await asyncio.sleep(0.5)  # the reader stalls while the engine keeps producing
        while_stalled = await bridge.call(lambda e: (e.allocator.num_used_blocks, len(e.ledger.records),
                                                     {s.seq_id: s.paused for s in e.scheduler.running}))
        received = []
        while not (received and received[-1].finished):
            received.append(await stream.next())
        return while_stalled, received

    try:
        (used_blocks, ended, running), received = asyncio.run(go())
    finally:
        bridge.stop()
    request_id = received[-1].request_id
    assert used_blocks > 0 and ended == 0  # paused, not cancelled: its KV is kept
    assert running == {request_id: True}  # still running (batch slot kept) but descheduled
    offline = LLMEngine(model, tokenizer, EngineConfig(num_blocks=64, block_size=8)).generate([prompt], params)[0]
    assert "".join(o.delta for o in received) == offline.text  # resumed exactly where it stopped
    assert received[-1].finish_reason == "length"
    assert engine.ledger.records[0].state is RequestState.FINISHED and engine.allocator.num_used_blocks == 0


def test_reader_that_never_returns_is_cancelled_after_the_backpressure_timeout(model, tokenizer):
    engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=64, block_size=8))
    bridge = EngineBridge(engine, stream_capacity=3, backpressure_timeout_s=0.3)

    async def go():
        bridge.start(asyncio.get_running_loop())
        stream = bridge.submit(tokenizer.encode("ROMEO:\n").ids, SamplingParams(max_tokens=100, ignore_eos=True))
        await asyncio.sleep(1.0)  # longer than the backpressure timeout
        received = []
        with pytest.raises(SlowClient):
            while True:
                received.append(await stream.next())
        used = await bridge.call(lambda e: (e.allocator.num_used_blocks, e.has_unfinished()))
        return received, used

    try:
        received, used = asyncio.run(go())
    finally:
        bridge.stop()
    assert len(received) == 3 and used == (0, False)
    assert engine.ledger.records[0].state is RequestState.CANCELLED


# ------------------------------------------------------------------------------------------ gate units


def test_token_bucket_and_quota_windows():
    now = [0.0]
    bucket = TokenBucket(rate_per_s=2.0, burst=2, clock=lambda: now[0])
    assert [bucket.try_take() for _ in range(3)] == [0.0, 0.0, 0.5]
    now[0] = 0.5
    assert bucket.try_take() == 0.0
    gate = IngressGate(limits=TenantLimits(100, 100, token_quota=5, quota_window_s=10), clock=lambda: now[0])
    gate.charge(gate.admit(None, 10), 5)
    with pytest.raises(Rejection) as exc:
        gate.admit(None, 10)
    assert exc.value.status == 429 and exc.value.retry_after_s == pytest.approx(10.0)
    now[0] = 11.0
    assert gate.admit(None, 10) == "anonymous" and gate.used_tokens("anonymous") == 0
    with pytest.raises(Rejection) as exc:
        gate.admit(None, 10**6)
    assert exc.value.status == 413
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(1.0, 0.5)


# ------------------------------------------------------------------------------------------ the command line


def test_one_command_serves_the_shipped_model():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "servelab.server", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                    assert json.loads(resp.read())["status"] == "ok"
                    break
            except OSError:
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.5)
        body = {"model": DEFAULT_MODEL_NAME, "prompt": "ROMEO:\n", "max_tokens": 24, "seed": 11, "stream": True}
        request = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            streamed = "".join(e["choices"][0]["text"] for e in sse_events(resp.read().decode()))
        engine = LLMEngine.from_pretrained()
        assert streamed == engine.generate(["ROMEO:\n"], SamplingParams(max_tokens=24, seed=11))[0].text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log = proc.stdout.read().decode()
        proc.stdout.close()
    # the KV pool logged at start as vLLM logs it: 32 slots of the model's 256 positions in 16-token blocks
    assert "# CPU blocks: 512 (8192 tokens, 16.0 MiB), maximum concurrency for 256 tokens per request: 32.00x" in log


def test_backpressure_policy_thresholds():
    policy = BackpressurePolicy(capacity=4, timeout=12)
    assert [policy.should_pause(n) for n in range(6)] == [False, False, False, False, True, True]
    assert [policy.should_resume(n) for n in range(5)] == [True, True, True, False, False]
    assert not policy.should_give_up(12) and policy.should_give_up(12.5)


# ------------------------------------------------------------------------------------------ OpenAI compatibility


@pytest.fixture(scope="module")
def real_model():
    """The shipped 2M-parameter Shakespeare model: unlike the random tiny one, its samples vary with the seed."""
    return load_checkpoint(None), load_tokenizer(None)


@pytest.fixture
def make_real_server(real_model):
    servers = []

    def start(**config):
        engine = LLMEngine(*real_model, EngineConfig(num_blocks=128, block_size=8, max_num_seqs=8))
        servers.append(BackgroundServer(engine, ServerConfig(model_name=MODEL, **config)))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def real_server(make_real_server):
    return make_real_server()


def client_for(server, api_key="sk-none") -> openai.OpenAI:
    """The official client on loopback, without retries (a test wants to see each answer) or proxies."""
    return openai.OpenAI(base_url=server.url, api_key=api_key, max_retries=0, timeout=30,
                         http_client=openai.DefaultHttpxClient(trust_env=False))


def scrape_now(server):
    with urllib.request.urlopen(metrics_url(server.url), timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        return parse_metrics(resp.read().decode())


def greedy_token(model, tokenizer, prompt, **params) -> int:
    engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=64, block_size=8))
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, **params)
    return engine.generate([prompt], params)[0].token_ids[0]


def test_official_client_completions_and_chat(real_server, real_model):
    server, (model, tokenizer) = real_server, real_model
    client = client_for(server)
    done = client.completions.create(model=MODEL, prompt="ROMEO:\n", max_tokens=12, seed=4,
                                     extra_body={"ignore_eos": True})
    assert done.choices[0].text == offline_text(model, tokenizer, "ROMEO:\n",
                                                SamplingParams(max_tokens=12, seed=4, ignore_eos=True))
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 12
    assert done.usage.prompt_tokens == len(tokenizer.encode("ROMEO:\n").ids)
    chunks = list(client.completions.create(model=MODEL, prompt="ROMEO:\n", max_tokens=12, seed=4, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].usage.completion_tokens == 12
    messages = [{"role": "user", "content": "Hark!"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, seed=2)
    expected = offline_text(model, tokenizer, render_chat(messages),
                            SamplingParams(max_tokens=10, seed=2, stop=("\n\n",)))
    assert chat.choices[0].message.content == expected and chat.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, seed=2, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, seed=2)
    assert again.choices[0].message.content == expected and expected  # seeded: reproducible
    other = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, seed=3)
    assert other.choices[0].message.content != expected  # and the seed matters
    assert client.models.retrieve(MODEL).id == MODEL
    assert [m.id for m in client.models.list()] == [MODEL]
    assert_engine_clean(server)


def test_async_official_client_streams_concurrently_and_a_dropped_stream_frees_its_request(real_server, real_model):
    server, (model, tokenizer) = real_server, real_model
    prompts = [f"{name}:\n" for name in ("ROMEO", "JULIET", "HAMLET", "OTHELLO", "KING HENRY", "PORTIA")]

    async def streamed(client, prompt, seed):
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, seed=seed, stream=True,
                                                 extra_body={"ignore_eos": True})
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def dropped(client):
        stream = await client.completions.create(model=MODEL, prompt="ROMEO:\n", max_tokens=250, stream=True,
                                                 extra_body={"ignore_eos": True})
        async for _ in stream:
            break  # the client goes away after its first chunk
        await stream.close()

    async def run():
        async with openai.AsyncOpenAI(base_url=server.url, api_key="sk-none", max_retries=0, timeout=30,
                                      http_client=openai.DefaultAsyncHttpxClient(trust_env=False)) as client:
            texts = await asyncio.gather(*(streamed(client, p, seed) for seed, p in enumerate(prompts)),
                                         dropped(client))
        return texts[:-1]

    texts = asyncio.run(run())
    assert texts == [offline_text(model, tokenizer, p, SamplingParams(max_tokens=10, seed=seed, ignore_eos=True))
                     for seed, p in enumerate(prompts)]
    assert_engine_clean(server)
    states = sorted(r.state.value for r in server.call(lambda e: e.ledger.records))
    assert states == ["cancelled"] + ["finished"] * len(prompts)  # the dropped stream was cancelled, not run out


def test_official_client_n_stop_logit_bias_and_list_prompts(real_server, real_model):
    server, (model, tokenizer) = real_server, real_model
    client = client_for(server)
    many = client.completions.create(model=MODEL, prompt="JULIET:\n", max_tokens=8, n=3, seed=9, temperature=1.0,
                                     extra_body={"ignore_eos": True})
    assert [c.index for c in many.choices] == [0, 1, 2] and len({c.text for c in many.choices}) == 3
    for c in many.choices:
        assert c.text == offline_text(model, tokenizer, "JULIET:\n",
                                      SamplingParams(max_tokens=8, seed=9 + c.index, ignore_eos=True))
    records = server.call(lambda e: e.ledger.records)
    assert len(records) == 1  # n samples of one engine request (prefilled once, forked), not n requests
    streamed = {}
    for chunk in client.completions.create(model=MODEL, prompt="JULIET:\n", max_tokens=8, n=3, seed=9, stream=True,
                                           extra_body={"ignore_eos": True}):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {c.index: c.text for c in many.choices}
    full = client.completions.create(model=MODEL, prompt="ROMEO:\n", max_tokens=30, seed=1,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = next(ch for k, ch in enumerate(full) if k > 0 and ch not in full[:k])  # a first occurrence after 0
    cut = client.completions.create(model=MODEL, prompt="ROMEO:\n", max_tokens=30, seed=1, stop=[stop],
                                    extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop" and cut.text == full[:full.index(stop)]
    top = greedy_token(model, tokenizer, "ROMEO:\n")
    plain = client.completions.create(model=MODEL, prompt="ROMEO:\n", max_tokens=1, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text
    assert plain == tokenizer.decode([top])
    biased = client.completions.create(model=MODEL, prompt="ROMEO:\n", max_tokens=1, temperature=0,
                                       logit_bias={str(top): -100}, extra_body={"ignore_eos": True}).choices[0].text
    second = greedy_token(model, tokenizer, "ROMEO:\n", logit_bias={top: -100.0})
    assert biased == tokenizer.decode([second]) and second != top
    forced = client.completions.create(model=MODEL, prompt="ROMEO:\n", max_tokens=3, temperature=0,
                                       logit_bias={"65": 100}, extra_body={"ignore_eos": True})
    assert forced.choices[0].text == tokenizer.decode([65, 65, 65])
    ids = tokenizer.encode("JULIET:\n").ids
    listed = client.completions.create(model=MODEL, prompt=["ROMEO:\n", "JULIET:\n"], max_tokens=5, n=2, seed=3,
                                       extra_body={"ignore_eos": True})
    by_ids = client.completions.create(model=MODEL, prompt=[tokenizer.encode("ROMEO:\n").ids, ids], max_tokens=5,
                                       n=2, seed=3, extra_body={"ignore_eos": True})
    assert [c.index for c in listed.choices] == [0, 1, 2, 3]  # index = prompt_i * n + j
    for c in listed.choices:
        prompt = ["ROMEO:\n", "JULIET:\n"][c.index // 2]
        assert c.text == offline_text(model, tokenizer, prompt,
                                      SamplingParams(max_tokens=5, seed=3 + c.index % 2, ignore_eos=True))
    assert [c.text for c in by_ids.choices] == [c.text for c in listed.choices]
    assert listed.usage.prompt_tokens == len(tokenizer.encode("ROMEO:\n").ids) + len(ids)
    assert listed.usage.completion_tokens == 20
    single_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, seed=3,
                                           extra_body={"ignore_eos": True})
    assert single_ids.choices[0].text == listed.choices[2].text
    assert_engine_clean(server)


def test_chat_without_max_tokens_may_use_the_whole_context(real_server):
    client = client_for(real_server)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Speak."}],
                                          stop=["@@@"], extra_body={"ignore_eos": True})
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == 256  # the context limit, not 16


def test_official_client_error_classes_name_the_field(make_real_server):
    server = make_real_server(api_keys={"sk-a": "alice"}, tenant_limits=TenantLimits(requests_per_s=0.01, burst=3))
    client = client_for(server, "sk-a")
    cases = [(dict(prompt="x", temperature=5), "temperature"), (dict(prompt="x", max_tokens=0), "max_tokens"),
             (dict(prompt="x", logit_bias={"99999": 1}), "logit_bias"), (dict(prompt=[[1], "x"]), "prompt[1]")]
    for kwargs, param in cases[:2]:
        with pytest.raises(openai.BadRequestError) as exc:
            client.completions.create(model=MODEL, **kwargs)
        assert exc.value.param == param and exc.value.type == "invalid_request_error" and param in exc.value.message
    with pytest.raises(openai.NotFoundError) as exc:
        client.completions.create(model="gpt-4", prompt="x")
    assert exc.value.param == "model" and exc.value.code == "model_not_found"
    with pytest.raises(openai.RateLimitError) as exc:
        client.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert exc.value.type == "rate_limit_error" and exc.value.code == "rate_limit_exceeded"
    with pytest.raises(openai.AuthenticationError) as exc:
        client_for(server, "sk-wrong").completions.create(model=MODEL, prompt="x")
    assert exc.value.type == "authentication_error" and exc.value.code == "invalid_api_key"
    open_server = make_real_server()
    open_client = client_for(open_server)
    for kwargs, param in cases[2:]:
        with pytest.raises(openai.BadRequestError) as exc:
            open_client.completions.create(model=MODEL, **kwargs)
        assert exc.value.param == param
    # unpaired surrogates, as the Node SDK sends them (the Python client cannot encode them at all)
    for path, body, param in (
            ("/v1/completions", {"prompt": "a \ud83d b"}, "prompt"),
            ("/v1/completions", {"prompt": ["ok", "\udc00"]}, "prompt[1]"),
            ("/v1/completions", {"prompt": "x", "stop": ["\udfff"]}, "stop"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud83d"}]}, "messages[0].content"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
             "messages[0].content"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "name": "A\udfff"}]},
             "messages[0].name")):
        error = assert_json_error(*raw_request(open_server, "POST", path, json.dumps({"model": MODEL} | body).encode()),
                                  400, "invalid_request_error")
        assert error["param"] == param and "Unicode" in error["message"]
    with pytest.raises(openai.NotFoundError) as exc:
        open_client.models.retrieve("nope")
    assert exc.value.param == "model" and "nope" in exc.value.message


def raw_request(server, method, path, body: bytes | None = None, headers=None):
    """One HTTP exchange with http.client: (status, headers, body bytes); a 10 s timeout catches a hang."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def assert_json_error(status, headers, data, expected_status, error_type):
    assert status == expected_status and headers["Content-Type"].startswith("application/json")
    error = json.loads(data)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == error_type
    assert error["code"] is None or isinstance(error["code"], str)
    return error


def test_every_error_is_openai_json_and_bodies_are_bounded(server):
    deep = b'{"model": "tiny", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert len(deep) < 64 * 1024
    error = assert_json_error(*raw_request(server, "POST", "/v1/completions", deep), 400, "invalid_request_error")
    assert "deeper than" in error["message"]
    subnormal = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2, "temperature": 2.2250738585e-313})
    status, _, data = raw_request(server, "POST", "/v1/completions", subnormal.encode())  # found by the fuzz test
    assert status == 200 and json.loads(data)["choices"][0]["finish_reason"] in ("length", "stop")
    nested_ok = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2, "user": [[[[["deep but fine"]]]]]})
    assert raw_request(server, "POST", "/v1/completions", nested_ok.encode())[0] == 200
    for raw in (b'{"model": "tiny", "prompt": "x", "temperature": NaN}', b'{"model": "tiny", "prompt": "x"',
                b"\xff\xfe", b'{"model": "tiny", "prompt": "x", "seed": ' + b"9" * 5000 + b"}"):
        assert_json_error(*raw_request(server, "POST", "/v1/completions", raw), 400, "invalid_request_error")
    error = assert_json_error(*raw_request(server, "POST", "/v1/nowhere", b"{}"), 404, "not_found_error")
    assert error["code"] == "unknown_url" and "/v1/nowhere" in error["message"]
    status, headers, data = raw_request(server, "GET", "/v1/chat/completions")
    assert assert_json_error(status, headers, data, 405, "invalid_request_error")["code"] == "method_not_allowed"
    assert "POST" in headers["Allow"]
    big = json.dumps({"model": MODEL, "prompt": "x" * 70000}).encode()
    error = assert_json_error(*raw_request(server, "POST", "/v1/completions", big), 413, "invalid_request_error")
    assert error["code"] == "request_too_large"
    chunked = raw_request(server, "POST", "/v1/completions", iter([big[:40000], big[40000:]]))
    # an iterable body goes out chunked, without Content-Length: the limit holds while reading
    assert_json_error(*chunked, 413, "invalid_request_error")
    assert_engine_clean(server)


# ------------------------------------------------------------------------------------------ fuzz

JSON_LEAVES = (st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=True)
               | st.text(st.characters(codec=None), max_size=12) | st.sampled_from(["", "\ud83d", "ROMEO:\n", MODEL]))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
SMALL = st.one_of(st.integers(-2, 3), JSON_VALUES)
FIELDS = {"prompt": st.one_of(st.sampled_from(["ROMEO:\n", "a \udc00", ""]), st.lists(st.integers(-1, 400), max_size=4),
                              st.lists(st.lists(st.integers(0, 300), max_size=3), max_size=3), JSON_VALUES),
          "messages": st.one_of(st.lists(st.fixed_dictionaries(
              {"role": st.sampled_from(["user", "system", "robot", 3]), "content": st.one_of(JSON_LEAVES, SMALL)},
              optional={"name": JSON_LEAVES}), max_size=3), JSON_VALUES),
          "max_tokens": SMALL, "max_completion_tokens": SMALL, "n": SMALL, "temperature": JSON_VALUES,
          "top_p": JSON_VALUES, "top_k": SMALL, "min_p": JSON_VALUES, "seed": SMALL, "stream": JSON_VALUES,
          "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": JSON_LEAVES}), JSON_VALUES),
          "stop": JSON_VALUES, "logit_bias": st.one_of(st.dictionaries(st.sampled_from(["1", "x", "-3", "99999", "٣"]),
                                                                        JSON_LEAVES, max_size=2), JSON_VALUES),
          "ignore_eos": JSON_VALUES, "deadline_s": JSON_VALUES, "logprobs": JSON_VALUES, "best_of": SMALL,
          "presence_penalty": JSON_VALUES, "repetition_penalty": JSON_VALUES}
TEXT_VALUES = st.text(st.characters(codec=None), min_size=1, max_size=10)
PLAUSIBLE = {"prompt": st.one_of(st.sampled_from(["ROMEO:\n", "x"]),
                                 st.lists(st.integers(0, 299), min_size=1, max_size=5),
                                 st.lists(TEXT_VALUES, min_size=1, max_size=3)),
             "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                                         "content": TEXT_VALUES}), min_size=1, max_size=2),
             "max_tokens": st.integers(1, 6), "n": st.integers(1, 3), "temperature": st.floats(0, 2),
             "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 50), "min_p": st.floats(0, 1),
             "seed": st.integers(0, 2 ** 63 - 1), "stream": st.booleans(),
             "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
             "stop": st.one_of(TEXT_VALUES, st.lists(TEXT_VALUES, min_size=1, max_size=4)),
             "logit_bias": st.dictionaries(st.integers(0, 299).map(str), st.floats(-100, 100), max_size=3),
             "ignore_eos": st.booleans(), "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
             "repetition_penalty": st.floats(0.5, 2), "deadline_s": st.floats(0.5, 60)}


@st.composite
def nearly_valid(draw):
    """A plausible body (all fields in range) with at most one field replaced by an arbitrary JSON value."""
    body = {"model": MODEL} | draw(st.fixed_dictionaries({}, optional=PLAUSIBLE))
    if draw(st.booleans()):
        body[draw(st.sampled_from(sorted(FIELDS)))] = draw(JSON_VALUES)
    return json.dumps(body).encode()


BODIES = st.one_of(
    nearly_valid(), nearly_valid(),
    st.fixed_dictionaries({"model": st.sampled_from([MODEL, MODEL, MODEL, "other", None, 3])},
                          optional=FIELDS).map(lambda b: json.dumps(b).encode()),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
    st.integers(1, 3000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.sampled_from([b"NaN", b"1e999999", b"-" * 3, b'{"model": "tiny", "prompt": "x", "n": 1e400}']))


@pytest.fixture(scope="module")
def fuzz_server(model, tokenizer):
    engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=64, block_size=8, max_num_seqs=8, max_model_len=40))
    unlimited = TenantLimits(requests_per_s=1e6, burst=1e6)
    server = BackgroundServer(engine, ServerConfig(model_name=MODEL, tenant_limits=unlimited))
    yield server
    server.close()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=BODIES)
def test_fuzzed_bodies_never_get_a_5xx(fuzz_server, path, body):
    status, headers, data = raw_request(fuzz_server, "POST", path, body)
    event(f"HTTP {status}")
    assert status < 500, data[:300]
    if status >= 400:
        assert_json_error(status, headers, data, status, json.loads(data)["error"]["type"])
    elif headers["Content-Type"].startswith("text/event-stream"):
        assert data.endswith(b"data: [DONE]\n\n") and b'"error"' not in data
    else:
        assert json.loads(data)["choices"]


# ------------------------------------------------------------------------------------------ metrics


def test_metrics_count_requests_tokens_and_latencies(server, tokenizer):
    before = scrape_now(server)
    client = client_for(server)
    replies = [client.completions.create(model=MODEL, prompt="ROMEO:\n" * (i + 1), max_tokens=6 + i, n=1 + i % 2,
                                         extra_body={"ignore_eos": True}) for i in range(4)]
    replies.append(client.completions.create(model=MODEL, prompt="x", max_tokens=1))  # admitted and done in one step
    after = scrape_now(server)
    labels = {"model_name": MODEL}
    generated = sum(r.usage.completion_tokens for r in replies)
    assert after.value("servelab:generation_tokens_total", tenant="anonymous", **labels) \
        - before.value("servelab:generation_tokens_total", **labels) == generated
    assert after.value("servelab:prompt_tokens_total", **labels) - before.value("servelab:prompt_tokens_total") \
        == sum(r.usage.prompt_tokens for r in replies)
    assert after.value("servelab:request_success_total", **labels) == 5
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        delta = histogram_delta(before, after, f"servelab:{name}", **labels)
        assert delta.count == 5 and delta.buckets[-1] == (math.inf, 5) and 0 < delta.mean < 10
    ttft = histogram_delta(before, after, "servelab:time_to_first_token_seconds", **labels)
    e2e = histogram_delta(before, after, "servelab:e2e_request_latency_seconds", **labels)
    assert ttft.sum < e2e.sum
    steps = sum(6 + i - 1 for i in range(4))  # outputs after each request's first, one per step
    assert histogram_delta(before, after, "servelab:inter_token_latency_seconds", **labels).count == steps
    assert after.value("servelab:kv_cache_usage_perc", **labels) == 0.0
    assert after.value("servelab:num_requests_running", **labels) == 0.0


def test_histogram_quantile_interpolates_inside_buckets():
    delta = HistogramDelta(10, 3.0, ((0.1, 2.0), (0.5, 8.0), (1.0, 10.0), (math.inf, 10.0)))
    assert delta.mean == pytest.approx(0.3)
    assert delta.quantile(0.5) == pytest.approx(0.1 + 0.4 * 3 / 6)
    assert delta.quantile(0.1) == pytest.approx(0.05) and delta.quantile(1.0) == pytest.approx(1.0)
    assert math.isnan(HistogramDelta(0, 0.0, ()).quantile(0.5))
    with pytest.raises(ValueError, match="q"):
        delta.quantile(1.5)


def test_preemptions_and_kv_usage_are_exported(make_server):
    server = make_server(engine_kwargs={"num_blocks": 12, "block_size": 8, "max_num_seqs": 4})
    client = client_for(server)

    async def burst():
        async with aiohttp.ClientSession() as session:
            async def one(i):
                body = {"model": MODEL, "prompt": f"ROMEO {i}:\n", "max_tokens": 40, "ignore_eos": True}
                async with session.post(server.url + "/completions", json=body) as resp:
                    return resp.status
            return await asyncio.gather(*(one(i) for i in range(4)))
    assert asyncio.run(burst()) == [200] * 4
    metrics = scrape_now(server)
    assert metrics.value("servelab:num_preemptions_total", model_name=MODEL) >= 1  # 4 x 6 blocks > 12
    assert metrics.value("servelab:kv_cache_usage_perc") == 0.0
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).choices


def test_disconnect_storm_leaves_nothing_running(make_server):
    server = make_server(engine_kwargs={"num_blocks": 128, "block_size": 8, "max_num_seqs": 8})
    streams, dropped = 30, set(range(0, 30, 3))

    async def storm():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams)) as session:
            async def one(i):
                body = {"model": MODEL, "prompt": f"JULIET {i}:\n", "max_tokens": 60 if i in dropped else 20,
                        "ignore_eos": True, "stream": True}
                async with session.post(server.url + "/completions", json=body) as resp:
                    assert resp.status == 200
                    if i in dropped:
                        await resp.content.readline()  # the first event arrived: now vanish mid-stream
                        resp.close()
                        return None
                    return await resp.text()
            return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(streams))), 60)
    texts = asyncio.run(storm())
    assert all(t.endswith("data: [DONE]\n\n") for i, t in enumerate(texts) if i not in dropped)
    assert_engine_clean(server)
    metrics = scrape_now(server)
    assert metrics.value("servelab:num_requests_running", model_name=MODEL) == 0
    assert metrics.value("servelab:num_requests_waiting", model_name=MODEL) == 0
    assert metrics.value("servelab:kv_cache_usage_perc", model_name=MODEL) == 0
    assert metrics.value("servelab:request_success_total") == streams
    assert metrics.value("servelab:request_success_total", finished_reason="abort") >= len(dropped) // 2


# ------------------------------------------------------------------------------------------ the book's demos


def test_demo_functions_show_the_wire_the_client_and_two_boundaries(real_model):
    model, tokenizer = real_model
    expected = offline_text(model, tokenizer, "ROMEO:\n", SamplingParams(max_tokens=12, seed=1))
    with course_server() as server:  # the shipped model, on a free loopback port
        port = server.port
        body = {"model": server.config.model_name, "prompt": "ROMEO:\n", "max_tokens": 12, "seed": 1, "stream": True}
        short = raw_exchange(server, body, max_events=5)
        assert short.startswith("POST /v1/completions HTTP/1.1\nHost: 127.0.0.1:")
        assert "\n\nHTTP/1.1 200 OK\nContent-Type: text/event-stream" in short
        assert short.endswith("data: [DONE]") and "more data: events) ..." in short
        assert short.count("data: {") == 4  # 3 first events, then the last one before [DONE]
        assert stream_text(raw_exchange(server, body, max_events=100)) == expected
        assert "".join(openai_stream(server, "ROMEO:\n", max_tokens=12, seed=1)) == expected
        client, served = ttft_at_two_boundaries(server, rate=10.0, duration_s=1.0, seed=2)
        assert client["requests"] == served["requests"] >= 5  # the same requests, seen at both boundaries
        assert client["mean_ms"] > served["mean_ms"] > 0  # the client's boundary includes the server's
        assert served["p50_ms"] <= served["p90_ms"]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # stopped cleanly


def test_chat_uses_the_checkpoints_own_template_when_it_has_one():
    from servelab.model.chat_template import ChatTemplate
    from servelab.server.protocol import chat_prompt, parse_request
    from servelab.server.config import ServerConfig

    template = ChatTemplate("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert chat_prompt(messages, template) == "<|user|>hi\n<|assistant|>"
    assert chat_prompt(messages, None) == "USER:\nhi\n\nASSISTANT:\n"
    body = {"model": ServerConfig().model_name, "messages": messages}
    assert parse_request(body, True, ServerConfig(), None, template).params.stop == ()  # EOS ends the turn
    assert parse_request(body, True, ServerConfig(), None, None).params.stop == ("\n\n",)
    with pytest.raises(Exception, match=r"messages\[0\]\.content"):
        chat_prompt([{"role": "user", "content": 3}], template)


def test_demo_coroutines_run_inside_a_running_event_loop():
    import asyncio

    from servelab.server.demo import run_to_completion

    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    async def from_inside_a_loop() -> int:  # as in a Jupyter cell, where asyncio.run would refuse
        return run_to_completion(answer())

    assert run_to_completion(answer()) == 42
    assert asyncio.run(from_inside_a_loop()) == 42
