"""``LLMEngine.from_pretrained`` on a stand-in for a real Hub model, with no download: a random-weight
checkpoint of SmolLM2-135M-Instruct's exact configuration written by ``transformers`` (safetensors), a
byte-level BPE tokenizer trained here on a few lines, and a SmolLM2-style Jinja chat template. The engine
must produce ``transformers``' greedy tokens and render the template as ``transformers`` does."""

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from servelab.model.chat_template import apply_chat_template, load_chat_template
from servelab.engine import LLMEngine
from servelab.model.pretrained import SMOLLM2_135M_CONFIG, resolve_checkpoint
from servelab.sampling import SamplingParams

transformers = pytest.importorskip("transformers")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
TEXT = ["What is a KV cache?", "It stores the keys and values of every token seen so far.",
        "Why batch requests together?", "One pass over the weights then serves many sequences."] * 8
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
MESSAGES = [{"role": "user", "content": "What is a KV cache?"}]
NEW_TOKENS = 4


def write_tokenizer(directory) -> None:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(TEXT, trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>",
        "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "special": True}, "pad_token": "<|im_end|>",
        "chat_template": CHAT_TEMPLATE}))


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """The stand-in checkpoint, built once per test session (135 M parameters, ~540 MB in fp32)."""
    directory = tmp_path_factory.mktemp("smollm2-135m-random")
    config = transformers.LlamaConfig(**{k: v for k, v in SMOLLM2_135M_CONFIG.items()
                                         if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    write_tokenizer(directory)
    return directory


def test_smollm2_shaped_checkpoint_greedy_matches_transformers(smollm2_dir, engine_device):
    engine = LLMEngine.from_pretrained(smollm2_dir, dtype="float32", num_blocks=16)
    cfg = engine.runner.model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, cfg.rope_theta, cfg.tie_word_embeddings,
            cfg.max_position_embeddings) == (30, 576, 9, 3, 64, 1536, 49152, 100000.0, True, 8192)
    assert engine.runner.model.lm_head.weight.device.type == engine_device
    prompt = engine.chat_template.apply(MESSAGES)
    prompt_ids = engine.tokenizer.encode(prompt).ids
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    ours = list(engine.generate([prompt_ids], params)[0].token_ids)

    hf = transformers.LlamaForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).to(engine_device).eval()
    hf_tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(smollm2_dir)
    assert hf_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == prompt
    assert hf_tokenizer(prompt)["input_ids"] == prompt_ids
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids], device=engine_device)
        theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             do_sample=False, eos_token_id=None, pad_token_id=2)[0, len(prompt_ids):].tolist()
    assert ours == theirs


def test_chat_template_renders_like_transformers(smollm2_dir):
    template = load_chat_template(smollm2_dir)
    assert template.special_tokens["eos_token"] == "<|im_end|>"  # a {"content": ...} entry, flattened
    hf_tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(smollm2_dir)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Why page the KV cache?"}]
    for messages in (MESSAGES, chat):
        for prompt in (True, False):
            assert apply_chat_template(messages, template, add_generation_prompt=prompt) == \
                hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        template.apply([{"role": "user"}])
    with pytest.raises(ValueError, match="non-empty list"):
        template.apply([])


def test_template_exceptions_and_bad_templates(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok"}))
    template = load_chat_template(tmp_path)
    assert template.apply(MESSAGES) == "ok"
    with pytest.raises(ValueError, match="user first"):
        template.apply([{"role": "assistant", "content": "x"}])
    (tmp_path / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(ValueError, match="not valid Jinja"):
        load_chat_template(tmp_path)
    assert load_chat_template(tmp_path / "nowhere") is None


def test_shipped_model_has_no_chat_template():
    assert LLMEngine.from_pretrained(num_blocks=8).chat_template is None


def test_hub_ids_need_allow_download(monkeypatch, tmp_path):
    import huggingface_hub

    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo_id, allow_patterns: calls.append((repo_id, allow_patterns)) or str(tmp_path))
    with pytest.raises(ValueError, match="allow_download=True"):
        resolve_checkpoint("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ValueError, match="allow_download=True"):
        LLMEngine.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert calls == []  # never a download by default
    assert resolve_checkpoint("HuggingFaceTB/SmolLM2-135M-Instruct", allow_download=True) == tmp_path
    assert calls[0][0] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "model.safetensors" in calls[0][1] and not any(p.endswith((".bin", ".pt")) for p in calls[0][1])
    with pytest.raises(ValueError, match="owner/name"):
        resolve_checkpoint("not-an-id", allow_download=True)
    with pytest.raises(TypeError, match="allow_download"):
        resolve_checkpoint("x/y", allow_download="yes")


def test_colab_model_shapes_give_their_published_sizes():
    """The model card sizes Qwen2.5-0.5B-Instruct and Llama-3.2-1B-Instruct on a T4 from these shapes:
    they must give the parameter counts the model cards publish (0.49 B and 1.24 B, tied embeddings)."""
    from servelab.model import LlamaForCausalLM, llama_config_from_hf
    from servelab.model.pretrained import COLAB_MODEL_CONFIGS

    sizes = {}
    for hub_id, hf_config in COLAB_MODEL_CONFIGS.items():
        with torch.device("meta"):
            sizes[hub_id] = sum(p.numel() for p in LlamaForCausalLM(llama_config_from_hf(hf_config)).parameters())
    assert round(sizes["Qwen/Qwen2.5-0.5B-Instruct"] / 1e9, 2) == 0.49
    assert round(sizes["meta-llama/Llama-3.2-1B-Instruct"] / 1e9, 2) == 1.24
