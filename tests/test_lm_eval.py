"""lm-evaluation-harness (``local-completions``) as a real client of the server, with its default flags and no
network: its ``bits_per_byte`` over the held-out Shakespeare text equals the model card's bits per character
within 2%, and its ``generate_until`` task gets exactly the engine's own greedy speeches."""

import json

import pytest
import torch

from servelab.engine import LLMEngine
from servelab.model.checkpoint import default_model_dir
from servelab.server import BackgroundServer, ServerConfig
from servelab.server.harness import heldout_docs, lm_eval_command, run_lm_eval, write_tasks

pytest.importorskip("lm_eval")
torch.set_num_threads(1)


def test_lm_eval_scores_the_heldout_text_like_the_model_card(tmp_path):
    engine = LLMEngine.from_pretrained()
    tokenizer = write_tasks(tmp_path, engine, default_model_dir() / "tokenizer.json")
    with BackgroundServer(engine, ServerConfig()) as server:  # default flags: rate 20/s, burst 40
        found = run_lm_eval(server.url, server.config.model_name, tmp_path, tokenizer)
        leaked = server.call(lambda e: e.allocator.num_free_blocks == e.allocator.num_blocks)
    card = json.loads((default_model_dir() / "training.json").read_text())["bits_per_char"]
    assert found["documents"] == len(heldout_docs()) and found["speeches"] == 5
    assert abs(found["bits_per_byte"] - card) / card < 0.02, (found, card)
    assert found["exact_match"] == 1.0
    assert leaked
    assert "--model local-completions" in lm_eval_command(server.url, "m", tmp_path, tokenizer)
