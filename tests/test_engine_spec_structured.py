"""Speculative decoding with structured output: drafts checked against the grammar state advanced
along them (the first refused one ends the draft), one mask per verify-row position, the grammar
rolled back after each walk; JSON-schema requests with speculation return valid output,
token-identical to plain greedy decoding, with n-gram drafts and with a draft model, and leave
every block free."""

import json
import types

import jsonschema
import pytest
import torch

from servelab.engine import LLMEngine, structured
from servelab.model import train_tokenizer
from servelab.sampling import SamplingParams
from servelab.sampling.grammar import (GrammarCompiler, GrammarSpec, accept, allowed_masks,
                                       new_matcher)

from test_engine_spec_decode import (EOS, NGRAM, TEXT, VOCAB, assert_clean, config, rolled_back,
                                     small_llama)

pytest.importorskip("xgrammar")
torch.set_num_threads(1)

RECORD = '{"name": "ROMEO", "age": 12, "lines": ["to be", "or not"]}\n'
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"lines": {"type": "array", "maxItems": 3,
                                                "items": {"type": "string", "maxLength": 8}}},
     "required": ["lines"], "additionalProperties": False},
    {"enum": ["ROMEO", "JULIET", "to be, or not to be"]},
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXT + RECORD * 10, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def model():
    return small_llama(0)


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer, VOCAB, EOS)


def schema_params(compiler, temperature: float = 0.0) -> list[SamplingParams]:
    return [SamplingParams(temperature=temperature, seed=i, max_tokens=60,
                           grammar=compiler.compile(GrammarSpec("json_schema", json.dumps(s))))
            for i, s in enumerate(SCHEMAS)]


def test_grammar_prefix_cuts_at_the_first_refused_draft_and_rolls_back(tokenizer, compiler):
    grammar = compiler.compile(GrammarSpec("json_schema", json.dumps(SCHEMAS[0])))
    seq = types.SimpleNamespace(params=SamplingParams(grammar=grammar),
                                matcher=new_matcher(grammar))
    good = tokenizer.encode('{"name": "R", "age": 1').ids
    bad = tokenizer.encode("x").ids
    before = allowed_masks([seq.matcher], VOCAB)[0]
    assert structured.grammar_prefix(seq, good + bad + good) == good  # no letter in an integer
    assert structured.grammar_prefix(seq, bad + good) == []
    assert torch.equal(allowed_masks([seq.matcher], VOCAB)[0], before)  # it is where it was
    masks = structured.verify_masks(seq, tuple(good + bad), VOCAB)
    assert len(masks) == len(good) + 2 and torch.equal(masks[0], before)
    fresh = new_matcher(grammar)
    for i, token in enumerate(good):  # mask i: a fresh matcher moved by the first i drafts
        assert torch.equal(masks[i], allowed_masks([fresh], VOCAB)[0])
        assert accept(fresh, token)
    assert torch.equal(masks[len(good)], allowed_masks([fresh], VOCAB)[0])
    assert not masks[len(good)][bad[0]]
    assert not masks[-1].any()  # past a refused draft nothing is allowed
    assert torch.equal(allowed_masks([seq.matcher], VOCAB)[0], before)
    structured.advance(seq, good)
    assert torch.equal(allowed_masks([seq.matcher], VOCAB)[0], allowed_masks([fresh], VOCAB)[0])


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_json_schema_requests_speculate_and_equal_plain_greedy(model, tokenizer, compiler, method):
    if method == "ngram":
        spec = NGRAM
    else:
        draft = small_llama(0)  # the target's initialisation, perturbed: agrees often
        with torch.no_grad():
            for param in draft.parameters():
                param.add_(0.02 * torch.randn_like(param))
        spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3}
    prompts = [tokenizer.encode(RECORD * 3).ids] * len(SCHEMAS)  # records: n-gram lookup's drafts
    params = schema_params(compiler)
    plain = LLMEngine(model, tokenizer, config(block_size=4)).generate(prompts, params)
    engine = LLMEngine(model, tokenizer, config(block_size=4, max_num_batched_tokens=32,
                                                speculative_config=spec))
    finals = {}
    for i, (prompt, request_params) in enumerate(zip(prompts, params)):  # while others decode
        engine.add_request(prompt, request_params, request_id=f"r{i}")
        finals |= {out.request_id: out for out in engine.step().outputs if out.finished}
    while engine.has_unfinished():
        finals |= {out.request_id: out for out in engine.step().outputs if out.finished}
        rolled_back(engine)
    for i, (schema, expected) in enumerate(zip(SCHEMAS, plain)):
        out = finals[f"r{i}"]
        assert out.finish_reason == "eos", (schema, out.text)
        assert out.token_ids == expected.token_ids, (schema, out.text)
        jsonschema.validate(json.loads(out.text), schema)
    stats = engine.stats().spec_decoding
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0  # grammar requests only
    assert_clean(engine, len(prompts))


def test_sampled_json_schema_requests_with_speculation_stay_valid(model, tokenizer, compiler):
    prompts = [tokenizer.encode(RECORD * 3).ids] * len(SCHEMAS) * 2
    params = schema_params(compiler, temperature=1.0) * 2
    engine = LLMEngine(model, tokenizer, config(block_size=4, speculative_config=NGRAM))
    for schema, out in zip(SCHEMAS * 2, engine.generate(prompts, params)):
        assert out.finish_reason == "eos", (schema, out.text)
        jsonschema.validate(json.loads(out.text), schema)
    assert engine.stats().spec_decoding.num_drafts > 0
    assert_clean(engine, len(prompts))
