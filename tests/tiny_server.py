"""The course server on the tiny test model, on 127.0.0.1, for the load generator's tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from servelab.engine import EngineConfig, LLMEngine
from servelab.model import LlamaConfig, LlamaForCausalLM, train_tokenizer
from servelab.server import BackgroundServer, ServerConfig, TenantLimits

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n\n" * 20


@contextmanager
def tiny_course_server() -> Iterator[BackgroundServer]:
    """A running server named "tiny"; the per-tenant rate limit (20 req/s) is lifted, since the
    tests send runs back to back and none may be refused with 429."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=256)).eval()
    engine = LLMEngine(model, train_tokenizer(TEXT, vocab_size=300),
                       EngineConfig(num_blocks=128, block_size=8))
    limits = TenantLimits(requests_per_s=1000.0, burst=1000.0)
    with BackgroundServer(engine, ServerConfig(model_name="tiny", tenant_limits=limits)) as server:
        yield server
