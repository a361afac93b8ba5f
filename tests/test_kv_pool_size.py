"""The KV pool sized from the memory there is (:mod:`servelab.engine.kv_pool_size`): the CPU rule, the cap at
what ``max_num_seqs`` full-length sequences fill, explicit sizes winning, the report, lazily committed pages."""

import logging

import pytest
import torch

from servelab.engine import EngineConfig, LLMEngine
from servelab.engine import kv_pool_size
from servelab.engine.gpu_memory import kv_block_bytes
from servelab.engine.kv_pool_size import PoolSize, available_memory_bytes, kv_blocks_for_cpu, max_useful_blocks
from servelab.engine.model_runner import KVCache, ModelRunner
from servelab.model import LlamaConfig, LlamaForCausalLM, load_tokenizer
from servelab.model.pretrained import SMOLLM2_135M_CONFIG

GiB, MiB = 2**30, 2**20


def tiny_model(positions: int = 128) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=2048, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=positions)).eval()


def test_the_cpu_rule_is_half_the_available_memory_up_to_4_gib():
    assert kv_blocks_for_cpu(2 * GiB, MiB) == 1024  # half of 2 GiB in 1 MiB blocks
    assert kv_blocks_for_cpu(22 * GiB, MiB) == 4096  # half would be 11 GiB: the 4 GiB cap binds
    assert kv_blocks_for_cpu(100, MiB) == 1  # never an empty pool
    assert kv_blocks_for_cpu(2 * GiB, MiB, fraction=0.25, cap_bytes=GiB) == 512
    with pytest.raises(ValueError, match="fraction"):
        kv_blocks_for_cpu(GiB, MiB, fraction=0.0)
    with pytest.raises(ValueError, match="bytes_per_block"):
        kv_blocks_for_cpu(GiB, 0)


def test_available_memory_is_read_from_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n")
    assert available_memory_bytes(meminfo) == 20_000_000 * 1024
    assert available_memory_bytes() > 0  # this machine's


def test_the_default_pool_is_what_the_batch_slots_can_fill(monkeypatch):
    monkeypatch.setattr(kv_pool_size, "available_memory_bytes", lambda: 8 * GiB)
    engine = LLMEngine(tiny_model(), load_tokenizer(), EngineConfig(block_size=16, max_num_seqs=32))
    assert engine.kv_pool.num_blocks == max_useful_blocks(32, 128, 16) == 256  # not 4 GiB of blocks
    assert engine.kv_pool.max_concurrency() == 32.0
    assert engine.kv_pool.max_concurrency(20) == 128.0  # 2 blocks each


def test_little_memory_gives_a_small_pool_and_explicit_sizes_win(monkeypatch):
    monkeypatch.setattr(kv_pool_size, "available_memory_bytes", lambda: MiB)
    per_block = 2 * 2 * 16 * 2 * 8 * 4  # K and V, 2 layers, 16 tokens, 2 KV heads of 8 dims, fp32
    assert ModelRunner(tiny_model(), EngineConfig(device="cpu")).num_blocks == MiB // 2 // per_block == 128
    assert ModelRunner(tiny_model(), EngineConfig(device="cpu", num_blocks=7)).num_blocks == 7
    explicit = EngineConfig(device="cpu", kv_cache_memory_bytes=64 * MiB)  # above the slot cap, as asked
    assert ModelRunner(tiny_model(), explicit).num_blocks == 64 * MiB // per_block == 16384
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        EngineConfig(kv_cache_memory_bytes=0)


def test_the_default_fits_32_requests_of_the_real_model_on_a_24_gib_machine(monkeypatch):
    config = LlamaConfig.from_hf_dict(SMOLLM2_135M_CONFIG)
    per_block = kv_block_bytes(config, 16, torch.float32)  # 737,280 bytes: 45 KiB a token
    blocks = min(kv_blocks_for_cpu(22 * GiB, per_block), max_useful_blocks(32, 8192, 16))
    pool = PoolSize(blocks, 16, per_block, 8192)
    assert pool.bytes <= 4 * GiB and pool.max_concurrency(2048) >= 32  # 32 requests of 2,048 tokens each


def test_the_engine_logs_its_pool_at_start(caplog):
    with caplog.at_level(logging.INFO, logger="servelab.engine.engine"):
        LLMEngine(tiny_model(), load_tokenizer(), EngineConfig(num_blocks=40, block_size=8, device="cpu"))
    assert ("# CPU blocks: 40 (320 tokens, 0.1 MiB), maximum concurrency for 128 tokens per request: 2.50x"
            in caplog.text)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_a_cpu_pool_commits_memory_only_where_kv_is_written():
    before = _resident_bytes()
    cache = KVCache(num_layers=4, num_blocks=16384, block_size=16, num_kv_heads=4, head_dim=64,
                    dtype=torch.float32, device=torch.device("cpu"))  # 1 GiB for K and 1 GiB for V
    assert cache.k.numel() * 4 == GiB and not cache.k.any()
    assert _resident_bytes() - before < 256 * MiB
    cache.layer_k_slots[0][:, :16].fill_(1.0)  # one block of one layer: a few pages
    assert _resident_bytes() - before < 256 * MiB and cache.k.sum() == 4 * 16 * 64
