"""The checkpoint families students bring, with no download: random-weight checkpoints with the
configurations of Llama-3.2-1B-Instruct, Qwen2.5-0.5B-Instruct, Qwen3-0.6B and SmolLM2-360M-Instruct
(their ``config.json`` values; layers cut to 2, and the vocabulary cut to the locally trained tokenizer's,
so every sampled id decodes), written by ``transformers`` ``save_pretrained``, each with a byte-level BPE
tokenizer trained here on the family's special tokens and the family's chat template (the parts these
chats render, ``tests/data/chat_templates.json``). The engine must match ``transformers``: greedy tokens
on batched, chunked and prefix-cached runs, logits to 1e-4 relative, chat ids equal
``apply_chat_template(tokenize=True)``; and each family once at its full layer count (hidden sizes
shrunk instead)."""

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from servelab.model.chat_template import chat_token_ids
from servelab.engine import EngineConfig, LLMEngine
from servelab.model.llama import DenseCausalAttention
from servelab.sampling import SamplingParams

transformers = pytest.importorskip("transformers")

TEMPLATES = json.loads((Path(__file__).parent / "data" / "chat_templates.json").read_text())
TEXT = ["What is a KV cache?", "It stores the keys and values of every token seen so far.",
        "Why batch requests together?", "One pass over the weights then serves many sequences.",
        "Paged attention splits the cache into blocks of sixteen tokens."] * 6
NEW_TOKENS = 6
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eom_id|>", "<|eot_id|>"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# config.json of each model (HF Hub), with the special-token ids renamed to the local tokenizer's
FAMILIES = {
    "llama-3.2-1b-instruct": dict(
        specials=LLAMA_SPECIALS, template="llama3.2", bos="<|begin_of_text|>", eos="<|eot_id|>", add_bos=True,
        config={"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
                "bos_token_id": "<|begin_of_text|>", "eos_token_id": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
                "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
                "max_position_embeddings": 131072, "mlp_bias": False, "num_attention_heads": 32,
                "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
                # original_max_position_embeddings 8192 shrunk to 32: the prompts (~60 tokens) outrun it
                "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                 "original_max_position_embeddings": 32, "rope_type": "llama3"},
                "rope_theta": 500000.0, "tie_word_embeddings": True}),
    "qwen2.5-0.5b-instruct": dict(
        specials=QWEN_SPECIALS, template="qwen2.5", bos=None, eos="<|im_end|>", add_bos=False,
        config={"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "bos_token_id": "<|endoftext|>",
                "eos_token_id": "<|im_end|>", "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
                "max_position_embeddings": 32768, "max_window_layers": 21, "num_attention_heads": 14,
                "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                "sliding_window": 32768, "tie_word_embeddings": True, "use_sliding_window": False}),
    "qwen3-0.6b": dict(
        specials=QWEN_SPECIALS, template="qwen3", bos=None, eos="<|im_end|>", add_bos=False,
        config={"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
                "bos_token_id": "<|endoftext|>", "eos_token_id": "<|im_end|>", "head_dim": 128, "hidden_act": "silu",
                "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
                "max_window_layers": 28, "num_attention_heads": 16, "num_hidden_layers": 28,
                "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
                "sliding_window": None, "tie_word_embeddings": True, "use_sliding_window": False}),
    "smollm2-360m-instruct": dict(
        specials=QWEN_SPECIALS, template="smollm2", bos="<|im_start|>", eos="<|im_end|>", add_bos=False,
        config={"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
                "bos_token_id": "<|im_start|>", "eos_token_id": "<|im_end|>", "hidden_act": "silu",
                "hidden_size": 960, "intermediate_size": 2560, "max_position_embeddings": 8192, "mlp_bias": False,
                "num_attention_heads": 15, "num_hidden_layers": 32, "num_key_value_heads": 5,
                "pad_token_id": "<|im_end|>", "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 100000,
                "tie_word_embeddings": True}),
}
CUT_LAYERS = 2
CHATS = [[{"role": "user", "content": "Why batch requests together? Tell me about paged attention and blocks."}],
         [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is a KV cache?"}],
         [{"role": "user", "content": "Why batch requests together?"},
          {"role": "assistant", "content": "One pass over the weights then serves many sequences."},
          {"role": "user", "content": "And the cache?"}]]


def build_tokenizer(family: dict) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(TEXT, trainers.BpeTrainer(
        vocab_size=384, special_tokens=family["specials"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    if family["add_bos"]:  # Llama 3's tokenizer.json prepends BOS itself: the doubled-BOS trap
        bos = family["bos"]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))])
    return tokenizer


def write_checkpoint(directory: Path, family: dict, **overrides) -> Path:
    """A random-weight checkpoint of ``family`` (its config with ``overrides``) and its tokenizer files."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(family)
    tokenizer.save(str(directory / "tokenizer.json"))
    ids = {t: tokenizer.token_to_id(t) for t in family["specials"]}
    config = {k: ([ids[t] for t in v] if isinstance(v, list) else ids[v]) if k.endswith("token_id") else v
              for k, v in family["config"].items()}
    config |= {"vocab_size": tokenizer.get_vocab_size()} | overrides
    hf_config = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).save_pretrained(directory)
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": family["bos"], "eos_token": family["eos"],
        "chat_template": TEMPLATES[family["template"]]}))
    return directory


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def checkpoint(request, tmp_path_factory, engine_device):
    """``(family name, folder, transformers model, transformers tokenizer, engine)``, layers cut."""
    family = FAMILIES[request.param]
    directory = write_checkpoint(tmp_path_factory.mktemp(request.param), family, num_hidden_layers=CUT_LAYERS)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).to(engine_device).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    engine = LLMEngine.from_pretrained(directory, dtype="float32", num_blocks=64)
    return request.param, directory, hf, hf_tokenizer, engine


def hf_greedy(hf, prompt_ids: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids], device=hf.device)
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def fresh(engine: LLMEngine, **config) -> LLMEngine:
    """Another engine over the same model and tokenizer, with other settings."""
    other = LLMEngine(engine.runner.model, engine.tokenizer, EngineConfig(num_blocks=64, **config))
    other.chat_template = engine.chat_template
    return other


def greedy(new_tokens: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)


def test_chat_ids_equal_apply_chat_template(checkpoint):
    name, _, _, hf_tokenizer, engine = checkpoint
    for chat in CHATS:
        ids = chat_token_ids(engine.chat_template, engine.tokenizer, chat)
        assert ids == hf_tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"]
        if name.startswith("llama"):  # one BOS, written by the template; the tokenizer's own is not added
            assert ids.count(engine.tokenizer.token_to_id("<|begin_of_text|>")) == 1
        specials = {engine.tokenizer.token_to_id(t) for t in FAMILIES[name]["specials"]}
        assert specials & set(ids)  # the specials in the rendered text stayed whole


def test_config_follows_the_family(checkpoint):
    name, _, hf, _, engine = checkpoint
    cfg = engine.runner.model.config
    assert cfg.qkv_bias == name.startswith("qwen2.5")
    assert cfg.qk_norm == name.startswith("qwen3")
    assert (cfg.rope_scaling or {}).get("rope_type") == ("llama3" if name.startswith("llama") else None)
    eos = hf.generation_config.eos_token_id
    assert set(cfg.eos_token_ids) == set(eos if isinstance(eos, list) else [eos])


def test_logits_match_transformers(checkpoint):
    _, _, hf, _, engine = checkpoint
    ids = torch.tensor([chat_token_ids(engine.chat_template, engine.tokenizer, CHATS[0])], device=hf.device)
    with torch.inference_mode():
        theirs = hf(ids).logits
        ours = engine.runner.model(ids, backend=DenseCausalAttention())
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4 * theirs.abs().max().item())


def test_batched_greedy_matches_transformers(checkpoint):
    _, _, hf, _, engine = checkpoint
    prompts = [chat_token_ids(engine.chat_template, engine.tokenizer, chat) for chat in CHATS]
    if FAMILIES[checkpoint[0]]["config"].get("rope_scaling"):
        assert min(map(len, prompts)) > FAMILIES[checkpoint[0]]["config"]["rope_scaling"][
            "original_max_position_embeddings"]
    for prompt, output in zip(prompts, fresh(engine).generate(prompts, greedy())):
        assert list(output.token_ids) == hf_greedy(hf, prompt)


def test_chunked_and_prefix_cached_greedy_match_transformers(checkpoint):
    _, _, hf, _, engine = checkpoint
    eng = fresh(engine, max_num_batched_tokens=16, block_size=8)
    first = chat_token_ids(eng.chat_template, eng.tokenizer, CHATS[2][:1])
    full = chat_token_ids(eng.chat_template, eng.tokenizer, CHATS[2])
    eng.generate([first], greedy(1))
    output = eng.generate([full], greedy())[0]
    assert len(full) > 2 * 16  # prefilled in chunks
    assert output.usage.cached_prompt_tokens >= 8  # the shared system / first turn came from the cache
    assert list(output.token_ids) == hf_greedy(hf, full)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_full_layer_count_greedy_matches_transformers(name, tmp_path, engine_device):
    family = FAMILIES[name]
    heads = family["config"]["num_attention_heads"]
    directory = write_checkpoint(tmp_path, family, hidden_size=8 * heads, head_dim=8, intermediate_size=64)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).to(engine_device).eval()
    engine = LLMEngine.from_pretrained(directory, dtype="float32", num_blocks=64)
    assert engine.runner.model.config.num_hidden_layers == family["config"]["num_hidden_layers"]
    prompt = chat_token_ids(engine.chat_template, engine.tokenizer, CHATS[1])
    assert list(engine.generate([prompt], greedy())[0].token_ids) == hf_greedy(hf, prompt)


def test_server_chat_feeds_apply_chat_template_ids(checkpoint):
    """The course server's chat path feeds the same ids (one BOS on Llama 3) and answers greedily alike."""
    openai = pytest.importorskip("openai")
    from servelab.server.demo import course_server

    _, _, hf, hf_tokenizer, engine = checkpoint
    chat = CHATS[1]
    expected = hf_tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"]
    with course_server(fresh(engine)) as server:
        client = openai.OpenAI(base_url=server.url, api_key="none")
        reply = client.chat.completions.create(model=server.config.model_name, messages=chat, temperature=0.0,
                                               max_tokens=NEW_TOKENS, extra_body={"ignore_eos": True})
    assert reply.usage.prompt_tokens == len(expected)
    assert reply.choices[0].message.content == engine.tokenizer.decode(hf_greedy(hf, expected))
