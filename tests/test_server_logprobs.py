"""Logprobs and echo, exact: the engine's numbers equal a direct dense forward of the model to 1e-4, a text's
summed logprobs equal its sequence log-likelihood, ``n > 1``, chunked prefill, prefix-cached prompts and
streaming give the same numbers, the generated token's entry is always there (EOS included), and the
official openai client reads both formats. A small random-weight model keeps it fast on CPU."""

import json
import math
import urllib.error
import urllib.request

import openai
import pytest
import torch

from servelab.engine import EngineConfig, LLMEngine
from servelab.engine.logprobs import token_logprobs
from servelab.sampling import SamplingParams
from servelab.server import BackgroundServer, ServerConfig
from test_server import TEXT, model, tokenizer  # noqa: F401  the server tests' tiny model, tokenizer and text

torch.set_num_threads(1)

MODEL = "tiny"
PROMPT = "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo? Deny thy father"


def make_engine(model, tokenizer, **kwargs):
    return LLMEngine(model, tokenizer, EngineConfig(**({"num_blocks": 64, "block_size": 8, "max_num_seqs": 8}
                                                       | kwargs)))


@pytest.fixture(scope="module")
def server(model, tokenizer):
    with BackgroundServer(make_engine(model, tokenizer), ServerConfig(model_name=MODEL)) as srv:
        yield srv


def dense_logprobs(model, ids):
    """log_softmax of one dense forward over ``ids``: row p scores token p + 1."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor(ids)).double(), dim=-1)


def post(server, path, body):
    request = urllib.request.Request(server.url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def completion(server, **body):
    status, text = post(server, "/completions", {"model": MODEL, "temperature": 0} | body)
    assert status == 200, text
    return json.loads(text)


# ------------------------------------------------------------------------------------------- the engine


def run(engine, prompt, params):
    rid = engine.add_request(prompt, params)
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step().outputs if o.request_id == rid]
    return outs


def test_engine_logprobs_equal_a_dense_forward_chunked_prefill_included(model, tokenizer):
    ids = tokenizer.encode(PROMPT).ids
    engine = make_engine(model, tokenizer, max_num_batched_tokens=8)  # the prompt takes several chunks
    outs = run(engine, ids, SamplingParams(temperature=0.7, seed=3, max_tokens=5, logprobs=3, prompt_logprobs=2,
                                           ignore_eos=True))
    prompt_lp = [o.prompt_logprobs for o in outs if o.prompt_logprobs is not None]
    assert len(prompt_lp) == 1 and len(prompt_lp[0]) == len(ids) - 1  # handed out once, every token after the first
    generated = [r for o in outs for r in o.logprobs]
    assert [r.token for r in generated] == list(outs[-1].token_ids)
    tokens = ids + [r.token for r in generated]
    dense = dense_logprobs(model, tokens[:-1])
    got = [r.logprob for r in prompt_lp[0] + tuple(generated)]
    want = [dense[p, t].item() for p, t in enumerate(tokens[1:])]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4
    for p, record in enumerate(prompt_lp[0] + tuple(generated)):  # the alternatives are the dense top-k
        k = len(record.top)
        assert [t for t, _ in record.top] == dense[p].topk(k).indices.tolist()


def test_token_logprobs_validates_its_shapes():
    with pytest.raises(ValueError, match="logits must be"):
        token_logprobs(torch.zeros(2, 5), [1], [0])


# ------------------------------------------------------------------------------------------- echo and scoring


def test_echo_scores_a_text_as_its_sequence_log_likelihood(server, model, tokenizer):
    ids = tokenizer.encode(TEXT[:300]).ids
    body = completion(server, prompt=ids, max_tokens=0, echo=True, logprobs=1)
    choice = body["choices"][0]
    lp = choice["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["token_logprobs"]) == len(ids) and body["usage"]["completion_tokens"] == 0
    assert choice["text"] == tokenizer.decode(ids) and choice["finish_reason"] == "length"
    dense = dense_logprobs(model, ids)
    log_likelihood = dense[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].sum().item()
    assert math.isclose(sum(lp["token_logprobs"][1:]), log_likelihood, abs_tol=1e-3)
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(ids))]


def test_lm_eval_request_shape_keeps_the_generated_token_even_eos(server, model, tokenizer):
    """lm-eval's loglikelihood request sums token_logprobs[ctxlen:-1]: the last entry is the generated
    token, so it must be there even when that token is EOS (here forced with logit_bias; the reported
    logprob is still the raw model's)."""
    eos = model.config.eos_token_id
    ids = tokenizer.encode(PROMPT).ids
    body = completion(server, prompt=ids, max_tokens=1, echo=True, logprobs=1, seed=1234,
                      logit_bias={str(eos): 100})
    lp = body["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1 and body["choices"][0]["finish_reason"] == "stop"
    dense = dense_logprobs(model, ids)
    assert math.isclose(lp["token_logprobs"][-1], dense[-1, eos].item(), abs_tol=1e-4)  # raw, not biased
    assert all(isinstance(top, dict) for top in lp["top_logprobs"][1:])


def test_processors_do_not_change_the_reported_distribution(server):
    plain = completion(server, prompt=PROMPT, max_tokens=4, logprobs=2)["choices"][0]
    shaped = completion(server, prompt=PROMPT, max_tokens=4, logprobs=2, repetition_penalty=1.5,
                        logit_bias={"7": -50})["choices"][0]
    first_plain, first_shaped = plain["logprobs"], shaped["logprobs"]
    plain_top, shaped_top = first_plain["top_logprobs"][0], first_shaped["top_logprobs"][0]
    assert plain_top.keys() == shaped_top.keys()  # raw_logprobs: before processors
    # equal up to float noise: a prefix-cache hit on the second request changes the kernels' shapes
    assert max(abs(plain_top[t] - shaped_top[t]) for t in plain_top) < 1e-4


def test_n_samples_prefix_cache_and_streaming_give_the_same_numbers(server, tokenizer):
    ids = tokenizer.encode(PROMPT * 2).ids  # long enough for whole cached blocks
    first = completion(server, prompt=ids, max_tokens=3, logprobs=2)["choices"][0]["logprobs"]
    again = completion(server, prompt=ids, max_tokens=3, logprobs=2)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # served from the prefix cache
    many = completion(server, prompt=ids, max_tokens=3, logprobs=2, n=3)["choices"]
    for lp in [again["choices"][0]["logprobs"]] + [c["logprobs"] for c in many]:
        assert lp["tokens"] == first["tokens"]
        assert max(abs(a - b) for a, b in zip(lp["token_logprobs"], first["token_logprobs"])) < 1e-4
    echoed = completion(server, prompt=ids, max_tokens=3, logprobs=2, echo=True)
    assert echoed["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # prompt logprobs skip the cache
    status, text = post(server, "/completions", {"model": MODEL, "prompt": ids, "max_tokens": 3, "logprobs": 2,
                                                 "echo": True, "temperature": 0, "stream": True})
    chunks = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]
    streamed = {key: [v for c in chunks for v in c["choices"][0]["logprobs"][key]] for key in
                ("tokens", "token_logprobs", "text_offset")}
    full = echoed["choices"][0]["logprobs"]
    assert streamed["tokens"] == full["tokens"] and streamed["text_offset"] == full["text_offset"]
    assert streamed["token_logprobs"][0] is None
    assert max(abs(a - b) for a, b in zip(streamed["token_logprobs"][1:], full["token_logprobs"][1:])) < 1e-9
    assert "".join(c["choices"][0]["text"] for c in chunks) == echoed["choices"][0]["text"]


# ------------------------------------------------------------------------------------------- clients and errors


def test_openai_client_reads_both_logprob_formats(server):
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    legacy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, logprobs=3, temperature=0)
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 4 and all(len(t) == 3 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == legacy.choices[0].text
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Romeo?"}],
                                          max_tokens=4, logprobs=True, top_logprobs=5, temperature=0, stop=["@@"])
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 5 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.logprob - 1e-12 for c in content)  # greedy: the top token
    assert bytes(b for c in content for b in c.bytes).decode() == chat.choices[0].message.content
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Romeo?"}],
                                           max_tokens=2)
    assert plain.choices[0].logprobs is None


@pytest.mark.parametrize("path, body, needle", [
    ("/completions", {"prompt": "x", "logprobs": 6}, "logprobs must be an integer in [0, 5]"),
    ("/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens must be an integer in [1"),
    ("/completions", {"prompt": "x", "echo": "yes"}, "echo must be true or false"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "needs logprobs"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs must be an integer in [0, 20]"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True}, "echo"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "not trained to call tools"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
     "tool_choice"),
])
def test_bad_logprob_fields_get_a_400_naming_them(server, path, body, needle):
    status, text = post(server, path, {"model": MODEL} | body)
    error = json.loads(text)["error"]
    assert status == 400 and needle in error["message"]


def test_chat_stream_carries_the_same_logprobs_per_chunk(server):
    body = {"messages": [{"role": "user", "content": "Romeo?"}], "max_tokens": 5, "logprobs": True,
            "top_logprobs": 2, "stop": ["@@"]}
    status, text = post(server, "/chat/completions", {"model": MODEL, "temperature": 0} | body)
    full = json.loads(text)["choices"][0]["logprobs"]["content"]
    status, text = post(server, "/chat/completions", {"model": MODEL, "temperature": 0, "stream": True} | body)
    chunks = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]
    streamed = [entry for c in chunks if c["choices"][0]["logprobs"] for entry in c["choices"][0]["logprobs"]["content"]]
    assert status == 200 and len(streamed) == len(full) == 5
    assert [e["token"] for e in streamed] == [e["token"] for e in full]
    assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(streamed, full)) < 1e-9
