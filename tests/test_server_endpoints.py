"""vLLM's utility endpoints and metrics on the course server: ``/tokenize`` (prompt or chat messages) gives the ids
the generation endpoints use, ``/detokenize`` inverts it, ``/version`` answers, bad input gets a 400 naming the field;
``prefix_cache_queries/hits_total`` count prompt tokens, ``iteration_tokens_total`` the tokens of each step."""

import json
import urllib.error
import urllib.request

import pytest
import torch

import servelab
from servelab.engine import EngineConfig, LLMEngine
from servelab.loadgen import parse_metrics
from servelab.model import LlamaConfig, LlamaForCausalLM, train_tokenizer
from servelab.server import BackgroundServer, ServerConfig

torch.set_num_threads(1)

MODEL = "tiny"
TEXT = ("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n") * 20


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXT, vocab_size=300)


@pytest.fixture
def server(tokenizer):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    engine = LLMEngine(LlamaForCausalLM(cfg).eval(), tokenizer, EngineConfig(num_blocks=64, block_size=8,
                                                                            max_num_seqs=8))
    with BackgroundServer(engine, ServerConfig(model_name=MODEL)) as srv:
        yield srv


def call(server, path, body=None):
    root = server.url.removesuffix("/v1")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(root + path, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_tokenize_gives_the_ids_generation_uses(server, tokenizer):
    status, got = call(server, "/tokenize", {"model": MODEL, "prompt": TEXT[:80], "return_token_strs": True})
    assert status == 200 and got["tokens"] == tokenizer.encode(TEXT[:80]).ids and got["count"] == len(got["tokens"])
    assert "".join(got["token_strs"]) == TEXT[:80] and got["max_model_len"] == 256
    _, done = call(server, "/v1/completions", {"model": MODEL, "prompt": TEXT[:80], "max_tokens": 1})
    assert done["usage"]["prompt_tokens"] == got["count"]
    messages = [{"role": "system", "content": "Speak verse."}, {"role": "user", "content": "Who is there?"}]
    _, chat = call(server, "/tokenize", {"messages": messages})
    assert chat["token_strs"] is None
    _, done = call(server, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1})
    assert done["usage"]["prompt_tokens"] == chat["count"]
    status, back = call(server, "/detokenize", {"model": MODEL, "tokens": chat["tokens"]})
    assert status == 200 and back["prompt"] == "SYSTEM:\nSpeak verse.\n\nUSER:\nWho is there?\n\nASSISTANT:\n"
    assert call(server, "/version") == (200, {"version": servelab.__version__})


@pytest.mark.parametrize("path, body, status, needle", [
    ("/tokenize", {"prompt": 5}, 400, "prompt must be a string"),
    ("/tokenize", {}, 400, "exactly one of prompt"),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400, "exactly one of prompt"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "b"}]}, 400, "messages[0].role"),
    ("/tokenize", {"prompt": "a", "model": "gpt-4"}, 404, "does not exist"),
    ("/tokenize", [1], 400, "JSON object"),
    ("/detokenize", {"tokens": [1, 300]}, 400, "outside the vocabulary"),
    ("/detokenize", {"tokens": "12"}, 400, "tokens must be"),
])
def test_utility_endpoints_refuse_bad_input_naming_the_field(server, path, body, status, needle):
    got, error = call(server, path, body)
    assert got == status and needle in error["error"]["message"]


def test_prefix_cache_and_iteration_token_metrics(server, tokenizer):
    prompt = tokenizer.encode(TEXT[:200]).ids
    steps = 4
    for _ in range(2):
        call(server, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": steps, "ignore_eos": True})
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/metrics") as resp:
        metrics = parse_metrics(resp.read().decode())
    queries = metrics.value("servelab:prefix_cache_queries_total", model_name=MODEL)
    hits = metrics.value("servelab:prefix_cache_hits_total", model_name=MODEL)
    block = 8
    cached = (len(prompt) - 1) // block * block  # the second request reuses every whole block but the last token's
    assert queries == 2 * len(prompt) and hits == cached
    computed = 2 * (len(prompt) + steps - 1) - cached  # prefill (minus the hit) + one decode token per later step
    assert metrics.value("servelab:iteration_tokens_total_sum", model_name=MODEL) == computed
    assert metrics.value("servelab:iteration_tokens_total_count", model_name=MODEL) == 2 * steps
