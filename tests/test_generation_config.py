"""``generation_config.json`` sampling defaults (vLLM's ``--generation-config auto``): a request that leaves
a field unset takes the checkpoint's value, one that sets it keeps its own, through the engine API and
through the server. The checkpoints are tiny random-weight folders written here (nothing is downloaded)."""

import asyncio
import json

import aiohttp
import pytest
import torch

from servelab.engine import LLMEngine
from servelab.model import LlamaConfig, LlamaForCausalLM, save_checkpoint, train_tokenizer
from servelab.model.generation_config import sampling_defaults
from servelab.sampling import SamplingParams
from servelab.server import BackgroundServer, ServerConfig

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n" * 20
GENERATION = {"bos_token_id": 1, "eos_token_id": 0, "do_sample": True, "temperature": 0.6, "top_p": 0.9,
              "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 5,
              "transformers_version": "4.45.0"}
FROM_FILE = {k: GENERATION[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")}


def write_checkpoint(directory, generation: dict | None):
    """A 2-layer random-weight Llama folder with its tokenizer and, unless None, ``generation_config.json``."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))
    save_checkpoint(model, directory)
    train_tokenizer(TEXT, vocab_size=300).save(str(directory / "tokenizer.json"))
    if generation is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    directory = write_checkpoint(tmp_path_factory.mktemp("with-generation-config"), GENERATION)
    return LLMEngine.from_pretrained(directory, device="cpu", dtype="float32", num_blocks=64, block_size=8)


def test_the_checkpoint_values_are_read(engine):
    assert dict(engine.default_sampling) == FROM_FILE  # max_new_tokens, do_sample: true and the ids are not sampling


def test_a_request_without_temperature_gets_the_checkpoint_s(engine):
    params = engine.sampling_params(max_tokens=12, seed=5)
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.repetition_penalty) == (
        0.6, 0.9, 20, 0.05, 1.1)
    spelled_out = SamplingParams(max_tokens=12, seed=5, **FROM_FILE)
    assert params == spelled_out
    assert engine.generate(["ROMEO:\n"], params)[0].token_ids == engine.generate(["ROMEO:\n"], spelled_out)[0].token_ids


def test_a_request_with_temperature_keeps_its_own(engine):
    params = engine.sampling_params(temperature=1.3, top_k=None, max_tokens=4)
    assert (params.temperature, params.top_k) == (1.3, None)
    assert (params.top_p, params.min_p, params.repetition_penalty) == (0.9, 0.05, 1.1)  # unset: the file's


def test_without_generation_config_the_course_defaults_stand(tmp_path):
    plain = LLMEngine.from_pretrained(write_checkpoint(tmp_path, None), device="cpu", dtype="float32", num_blocks=16)
    assert dict(plain.default_sampling) == {}
    assert plain.sampling_params(max_tokens=3) == SamplingParams(max_tokens=3)
    assert LLMEngine.default_sampling == {}  # from_pretrained sets the instance's, never the class's


@pytest.mark.parametrize("generation, expected", [
    ({"do_sample": False, "temperature": 0.6, "top_p": 0.9}, {"temperature": 0.0, "top_p": 0.9}),  # greedy
    ({"temperature": 0.7, "top_k": 0}, {"temperature": 0.7}),  # top_k 0: no top-k
    ({"top_k": -1, "top_p": None}, {}),
    ({"eos_token_id": [0, 1]}, {}),
])
def test_do_sample_false_is_greedy_and_disabled_fields_are_dropped(tmp_path, generation, expected):
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    assert sampling_defaults(tmp_path) == expected


@pytest.mark.parametrize("generation, needle", [
    ({"temperature": -0.5}, "temperature must be in"), ({"top_p": 1.5}, "top_p must be in"),
    ({"top_k": 2.5}, "top_k must be an int"), ({"do_sample": "no"}, "do_sample must be true or false"),
])
def test_bad_values_name_the_file_and_the_field(tmp_path, generation, needle):
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    with pytest.raises(ValueError, match=needle) as error:
        sampling_defaults(tmp_path)
    assert "generation_config.json" in str(error.value)


def served_params(engine: LLMEngine, extras: list[dict]) -> list[SamplingParams]:
    """The SamplingParams the server hands the engine for one /v1/completions body per ``extras``."""
    seen = []
    add_request = engine.add_request

    def spy(prompt, params, **kwargs):
        seen.append(params)
        return add_request(prompt, params, **kwargs)

    async def complete(server, extra: dict) -> int:
        body = {"model": "tiny", "prompt": "ROMEO:\n", "max_tokens": 3} | extra
        async with aiohttp.ClientSession() as session:
            async with session.post(server.url + "/completions", json=body) as resp:
                return resp.status

    engine.add_request = spy
    try:
        with BackgroundServer(engine, ServerConfig(model_name="tiny")) as server:
            assert [asyncio.run(complete(server, extra)) for extra in extras] == [200] * len(extras)
    finally:
        del engine.add_request
    return seen


def test_server_requests_take_the_checkpoint_defaults_unless_they_set_them(engine):
    without, with_temperature = served_params(engine, [{}, {"temperature": 0.25, "top_p": None}])
    assert (without.temperature, without.top_p, without.top_k, without.min_p, without.repetition_penalty) == (
        0.6, 0.9, 20, 0.05, 1.1)
    assert (with_temperature.temperature, with_temperature.top_p, with_temperature.top_k) == (0.25, 0.9, 20)


def test_server_without_generation_config_keeps_the_course_defaults(tmp_path):
    plain = LLMEngine.from_pretrained(write_checkpoint(tmp_path, None), device="cpu", dtype="float32", num_blocks=16)
    without, with_temperature = served_params(plain, [{}, {"temperature": 0.25}])
    assert (without.temperature, without.top_p, without.top_k, without.min_p, without.repetition_penalty) == (
        1.0, 1.0, None, 0.0, 1.0)
    assert with_temperature.temperature == 0.25
