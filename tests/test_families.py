"""Loading like the ecosystem, on tiny random checkpoints written by ``transformers``: transformers'
defaults per ``model_type`` (an absent ``tie_word_embeddings`` means untied for Llama), sharded
safetensors, every EOS id of ``config.json`` and ``generation_config.json``, and refusals that name the
feature and what is supported."""

import json

import pytest
import torch

from servelab.engine import EngineConfig, LLMEngine
from servelab.model.checkpoint import load_checkpoint
from servelab.model.families import config_from_hf
from servelab.model.tokenizer import load_tokenizer
from servelab.sampling import SamplingParams

transformers = pytest.importorskip("transformers")

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 2048, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def hf_checkpoint(directory, config: dict, **save):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config),
                                                       dtype=torch.float32).eval()
    hf.save_pretrained(directory, **save)
    return hf


def test_absent_tie_word_embeddings_follows_transformers_default(tmp_path):
    hf_checkpoint(tmp_path, TINY)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("tie_word_embeddings", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ours = load_checkpoint(tmp_path, device="cpu", dtype="float32")
    assert ours.config.tie_word_embeddings is False is hf.config.tie_word_embeddings
    ids = torch.tensor([[5, 17, 300, 9]])
    with torch.inference_mode():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-4, atol=1e-5)


def test_sharded_safetensors_load(tmp_path):
    hf = hf_checkpoint(tmp_path, TINY, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    ours = load_checkpoint(tmp_path, device="cpu", dtype="float32")
    ids = torch.tensor([[1, 2, 3, 400]])
    with torch.inference_mode():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-4, atol=1e-5)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "../elsewhere.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="lists shard '../elsewhere.safetensors', which is not a file"):
        load_checkpoint(tmp_path, device="cpu")


def test_every_eos_id_of_both_files_stops(tmp_path):
    """The greedy continuation's third token is declared EOS in generation_config.json only."""
    hf_checkpoint(tmp_path, TINY | {"eos_token_id": [2000]})
    tokenizer = load_tokenizer()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    prompt = [5, 17, 300, 9]
    free = LLMEngine.from_pretrained(tmp_path, device="cpu", dtype="float32", num_blocks=16)
    run = list(free.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0].token_ids)
    stop = next(t for i, t in enumerate(run) if i >= 2 and t not in run[:i] + [2000])
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2000, stop]}))
    engine = LLMEngine.from_pretrained(tmp_path, device="cpu", dtype="float32", num_blocks=16)
    assert engine.runner.model.config.eos_token_ids == (2000, stop)
    output = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8))[0]
    assert output.finish_reason == "eos"
    assert list(output.token_ids) == run[:run.index(stop)]  # the EOS token itself is not returned
    assert len(output.token_ids) >= 2


@pytest.mark.parametrize("change, words", [
    ({"model_type": "gemma"}, ["'gemma' is not supported", "llama, mistral, qwen2, qwen3"]),
    ({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}, ["sliding_window is 4096",
                                                                          "full causal attention"]),
    ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True,
      "sliding_window": 1024}, ["sliding_window is 1024"]),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, ["'yarn' is not supported", "default, linear, llama3"]),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, ["'dynamic' is not supported"]),
    ({"mlp_bias": True}, ["mlp_bias is true", "only on Qwen2's q/k/v"]),
    ({"hidden_act": "gelu"}, ["hidden_act must be 'silu'"]),
])
def test_unsupported_features_are_refused_by_name(change, words):
    with pytest.raises(ValueError) as err:
        config_from_hf(TINY | change)
    assert all(word in str(err.value) for word in words), str(err.value)


def test_family_defaults_follow_transformers():
    assert config_from_hf(TINY | {"model_type": "mistral", "architectures": ["MistralForCausalLM"],
                                  "sliding_window": None}).rope_theta == 10000.0
    qwen3 = config_from_hf(TINY | {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
    assert (qwen3.head_dim, qwen3.qk_norm, qwen3.tie_word_embeddings, qwen3.rms_norm_eps) == (128, True, False, 1e-6)
    linear = config_from_hf(TINY | {"rope_scaling": {"type": "linear", "factor": 2.0}})
    assert linear.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_linear_rope_scaling_matches_transformers(tmp_path):
    hf = hf_checkpoint(tmp_path, TINY | {"rope_scaling": {"rope_type": "linear", "factor": 4.0}})
    ours = load_checkpoint(tmp_path, device="cpu", dtype="float32")
    ids = torch.arange(40).unsqueeze(0)
    with torch.inference_mode():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-4, atol=1e-5)
    plain = load_checkpoint(tmp_path, device="cpu", dtype="float32")
    plain.config.rope_scaling = None  # the scaling is what makes the match
    with torch.inference_mode():
        assert not torch.allclose(plain(ids), hf(ids).logits, rtol=1e-4, atol=1e-5)
