"""Structured outputs through xgrammar: the engine's outputs parse and validate against a few hundred fuzzed JSON
schemas (seeded, greedy and sampled, in one batch with unconstrained requests that come out as they do alone);
greedy decoding is the argmax over the allowed tokens; the teaching ChoiceAutomaton's masks equal xgrammar's;
the server takes ``response_format`` and vLLM's ``guided_*`` fields, refuses a bad grammar with a 400 naming the
field, and counts the compile time in its own histogram."""

import json
import random
import urllib.error
import urllib.request

import jsonschema
import openai
import pytest
import torch

from servelab.sampling.constrained import ChoiceAutomaton
from servelab.engine import EngineConfig, LLMEngine
from servelab.sampling.grammar import GrammarCompiler, GrammarSpec, accept, allowed_masks, new_matcher
from servelab.loadgen import parse_metrics
from servelab.model import LlamaConfig, LlamaForCausalLM, train_tokenizer
from servelab.sampling import SamplingParams
from servelab.server import BackgroundServer, ServerConfig

pytest.importorskip("xgrammar")
torch.set_num_threads(1)

MODEL = "tiny"
VOCAB = 300
TEXT = ("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n"
        "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo? {\"name\": 12, \"ok\": true}\n\n") * 20
NUM_SCHEMAS = 300


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXT, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def compiler(model, tokenizer):
    return GrammarCompiler(tokenizer, VOCAB, model.config.eos_token_id)


def make_engine(model, tokenizer, **kwargs):
    return LLMEngine(model, tokenizer, EngineConfig(**({"num_blocks": 512, "block_size": 8, "max_num_seqs": 32}
                                                       | kwargs)))


# ------------------------------------------------------------------------------------------- fuzzed schemas


def leaf(rng: random.Random) -> dict:
    kind = rng.choice(["boolean", "integer", "string", "enum", "null", "const"])
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(2, 8)}
    if kind == "enum":
        return {"enum": rng.sample(["ROMEO", "JULIET", "nurse", 3, 7, "o'er", "a b"], rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["sun", 42, True])}
    return {"type": kind}


def value_schema(rng: random.Random, depth: int) -> dict:
    roll = rng.random()
    if depth > 0 and roll < 0.25:
        return object_schema(rng, depth - 1)
    if roll < 0.45:
        return {"type": "array", "items": leaf(rng), "minItems": rng.randint(0, 1), "maxItems": rng.randint(1, 3)}
    return leaf(rng)


def object_schema(rng: random.Random, depth: int = 1) -> dict:
    names = rng.sample(["name", "age", "line", "act", "scene", "speaker", "ok", "lines"], rng.randint(1, 3))
    return {"type": "object", "properties": {n: value_schema(rng, depth) for n in names},
            "required": names, "additionalProperties": False}


def test_fuzzed_schemas_always_parse_and_validate_in_a_shared_batch(model, tokenizer, compiler):
    rng = random.Random(23)
    schemas = [object_schema(rng) for _ in range(NUM_SCHEMAS)]
    engine = make_engine(model, tokenizer)
    prompts = ["ROMEO:\n", "JULIET:\n{", "O"]
    plain = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), SamplingParams(temperature=0.8, seed=5,
                                                                                         max_tokens=20)]
    alone = [out.text for out in engine.generate(prompts[:2], plain)]
    params = [SamplingParams(temperature=0 if i % 4 == 0 else 1.0, seed=i, max_tokens=200,
                             grammar=compiler.compile(GrammarSpec("json_schema", json.dumps(s))))
              for i, s in enumerate(schemas)]
    outs = engine.generate(prompts[:2] + [prompts[i % 3] for i in range(len(schemas))], plain + params)
    assert [o.text for o in outs[:2]] == alone  # the unconstrained rows shared batches with grammar rows
    for schema, out in zip(schemas, outs[2:]):
        assert out.finish_reason == "eos", (schema, out.text)
        jsonschema.validate(json.loads(out.text), schema)
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


def test_greedy_is_the_argmax_over_the_allowed_tokens(model, tokenizer, compiler):
    grammar = compiler.compile(GrammarSpec("regex", r"(ROMEO|JULIET|NURSE): [a-z]{2,6}\."))
    engine = make_engine(model, tokenizer)
    got = engine.generate(["KING:\n"], SamplingParams(temperature=0, max_tokens=30, grammar=grammar))[0]
    ids, matcher, chosen = tokenizer.encode("KING:\n").ids, new_matcher(grammar), []
    while not matcher.inner.is_terminated():
        with torch.no_grad():
            logits = model(torch.tensor(ids + chosen))[-1]
        mask = allowed_masks([matcher], VOCAB)[0]
        token = int(torch.where(mask, logits, -torch.inf).argmax())
        assert accept(matcher, token)
        chosen.append(token)
    assert chosen[-1] == model.config.eos_token_id
    assert tokenizer.decode(chosen[:-1]) == got.text and got.finish_reason == "eos"


def test_choice_masks_equal_the_teaching_automaton(tokenizer, compiler):
    choices = ["ROMEO", "JULIET", "NURSE", "ROMEO AND JULIET"]
    vocab = [tokenizer.decode([i]) for i in range(VOCAB)]
    automaton = ChoiceAutomaton(choices, vocab)
    grammar = compiler.compile(GrammarSpec("choice", tuple(choices)))
    for choice in choices:
        matcher, state = new_matcher(grammar), ""
        for token in tokenizer.encode(choice).ids:
            mask = allowed_masks([matcher], VOCAB)[0]
            mask[0] = False  # EOS: xgrammar allows it once a choice is complete; the automaton has no EOS
            assert mask.nonzero()[:, 0].tolist() == sorted(automaton.prefix_legal(state)), state
            assert accept(matcher, token)
            state += vocab[token]
    assert not accept(new_matcher(grammar), tokenizer.encode("X").ids[0])


def test_a_grammar_that_does_not_compile_is_a_value_error(compiler):
    with pytest.raises(ValueError, match="Unsupported type"):
        compiler.compile(GrammarSpec("json_schema", '{"type": "objectx"}'))
    with pytest.raises(ValueError, match="parenthesis"):
        compiler.compile(GrammarSpec("regex", "(ab"))
    with pytest.raises(ValueError, match="kind must be one of"):
        GrammarSpec("yaml", "x")


# ------------------------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server(model, tokenizer):
    with BackgroundServer(make_engine(model, tokenizer), ServerConfig(model_name=MODEL)) as srv:
        yield srv


def post(server, path, body):
    request = urllib.request.Request(server.url + path, json.dumps({"model": MODEL} | body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


SCHEMA = {"type": "object", "properties": {"speaker": {"enum": ["ROMEO", "JULIET"]},
                                           "act": {"type": "integer", "minimum": 1, "maximum": 5}},
          "required": ["speaker", "act"], "additionalProperties": False}


def test_openai_client_response_format_and_guided_fields(server):
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "Who speaks, in which act?"}]
    for seed in range(3):
        chat = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=60, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "line", "schema": SCHEMA}})
        jsonschema.validate(json.loads(chat.choices[0].message.content), SCHEMA)
        assert chat.choices[0].finish_reason == "stop"
    text = client.completions.create(model=MODEL, prompt="Who?", max_tokens=20, temperature=0,
                                     extra_body={"guided_choice": ["ROMEO", "JULIET"]}).choices[0].text
    assert text in ("ROMEO", "JULIET")
    _, body = post(server, "/completions", {"prompt": "Act", "max_tokens": 20, "guided_regex": "[0-9]{3}"})
    assert len(body["choices"][0]["text"]) == 3 and body["choices"][0]["text"].isdigit()
    _, body = post(server, "/chat/completions", {"messages": messages, "max_tokens": 40, "seed": 1,
                                                 "guided_json": SCHEMA})
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), SCHEMA)
    quote, close = (server.engine.tokenizer.encode(c).ids[0] for c in ('"', "}"))
    _, body = post(server, "/chat/completions", {"messages": messages, "max_tokens": 40, "temperature": 0,
                                                 "response_format": {"type": "json_object"},
                                                 "logit_bias": {str(quote): 30, str(close): 30}})
    assert isinstance(json.loads(body["choices"][0]["message"]["content"]), dict)  # the bias closes it quickly
    assert body["choices"][0]["finish_reason"] == "stop"
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/metrics") as resp:
        metrics = parse_metrics(resp.read().decode())
    assert metrics.value("servelab:grammar_compile_seconds_count", model_name=MODEL) == 7
    assert metrics.value("servelab:time_to_first_token_seconds_count", model_name=MODEL) == 7


@pytest.mark.parametrize("body, param, needle", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "response_format", "Unsupported type"),
    ({"response_format": {"type": "yaml"}}, "response_format", "response_format must be"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs"),
    ({"guided_regex": "(ab"}, "guided_regex", "cannot be compiled"),
    ({"guided_choice": "ROMEO"}, "guided_choice", "non-empty list"),
    ({"guided_choice": ["a"], "guided_regex": "b"}, "guided_regex", "at most one of"),
    ({"guided_choice": ["a"], "ignore_eos": True}, "ignore_eos", "cannot be combined"),
    ({"guided_json": "{not json"}, "guided_json", "not JSON"),
])
def test_bad_grammars_get_a_400_naming_the_field(server, body, param, needle):
    status, answer = post(server, "/chat/completions", {"messages": [{"role": "user", "content": "x"}]} | body)
    assert status == 400 and answer["error"]["param"] == param and needle in answer["error"]["message"]
