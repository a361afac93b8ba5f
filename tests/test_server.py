"""servelab.server over real HTTP on 127.0.0.1: streamed text equals the engine's offline output, disconnects
free every KV block, overload answers 429/503 with Retry-After, bad input gets a 4xx naming the problem,
deadlines and slow clients end requests without leaks. A small random-weight model keeps it fast on CPU."""

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import aiohttp
import pytest
import torch

from servelab.engine import EngineConfig, LLMEngine
from servelab.lifecycle import RequestState
from servelab.model import LlamaConfig, LlamaForCausalLM, train_tokenizer
from servelab.sampling import SamplingParams
from servelab.server import (DEFAULT_MODEL_NAME, BackgroundServer, EngineBridge, IngressGate, Rejection,
                             ServerConfig, TenantLimits, TokenBucket, render_chat)
from servelab.server.bridge import BackpressurePolicy, SlowClient

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
    server.call(lambda e: e.allocator.check_invariants())
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
        paused_at.append(len(engine.trace))
        release.wait(10)

    holder = threading.Thread(target=server.call, args=(hold,))
    holder.start()
    wait_for(lambda: paused_at)
    try:
        yield paused_at[0]
    finally:
        release.set()
        holder.join()


def test_disconnect_mid_stream_frees_every_block_within_one_step(server):
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
    later_steps = server.call(lambda e: e.trace[paused_at:])
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
    ({"model": MODEL, "prompt": "x", "logprobs": 5}, 400, "logprobs is not supported"),
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
        proc.stdout.close()


def test_backpressure_policy_thresholds():
    policy = BackpressurePolicy(capacity=4, timeout=12)
    assert [policy.should_pause(n) for n in range(6)] == [False, False, False, False, True, True]
    assert [policy.should_resume(n) for n in range(5)] == [True, True, True, False, False]
    assert not policy.should_give_up(12) and policy.should_give_up(12.5)
