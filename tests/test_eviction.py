"""Evicting the oldest tokens' KV changes what a full-attention model generates."""

from __future__ import annotations

import pytest
import torch

from servelab.kv.eviction import EvictedPrefixAttention, evicted_greedy, evicted_logits, first_difference
from servelab.model import LlamaConfig, LlamaForCausalLM

torch.set_num_threads(1)

# a scene whose next speaker is named only in its first tokens
SCENE = ("JULIET:\nWhat man art thou?\n\nROMEO:\nBy a name\nI know not how to tell thee who I am:\n"
         "My name, dear saint, is hateful to myself,\nBecause it is an enemy to thee.\n\n")


def test_no_eviction_is_the_dense_model():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    ids = [3, 17, 5, 42, 9, 11, 7]
    with torch.no_grad():
        dense = model(torch.tensor([ids]))[0, -1]
    torch.testing.assert_close(evicted_logits(model, ids, 0, len(ids) - 1), dense, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(evicted_logits(model, ids, 3, len(ids) - 1), dense, atol=1e-4)


def test_evicting_the_speaker_changes_the_shipped_models_continuation():
    from servelab.model import default_model_dir, load_checkpoint, load_tokenizer

    if not (default_model_dir() / "model.safetensors").is_file():
        pytest.skip("the shipped checkpoint is not in servelab/assets")
    model, tokenizer = load_checkpoint(device="cpu", dtype=torch.float32), load_tokenizer()
    ids = tokenizer.encode(SCENE).ids
    full = evicted_greedy(model, ids, 0, 6)
    assert tokenizer.decode(full).startswith("JULIET")  # the full history names the early speaker
    evicted = evicted_greedy(model, ids, 4, 6)  # 'JULIET:' gone
    assert first_difference(full, evicted) is not None
    assert "JULIET" not in tokenizer.decode(evicted)


def test_first_difference_and_bad_inputs():
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert first_difference([1, 2], [1, 2, 3]) is None
    with pytest.raises(ValueError, match="dropped must be an int >= 0"):
        EvictedPrefixAttention(-1, 3)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ValueError, match="dropped must be an int in"):
        evicted_greedy(model, [1, 2, 3], 3, 2)
    with pytest.raises(ValueError, match="prompt_ids"):
        evicted_greedy(model, [1, 99], 0, 2)
