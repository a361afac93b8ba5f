"""``gpu_memory_utilization``: the KV pool sized from GPU memory as vLLM does, checked on the CPU with
made-up memory figures; the CUDA measurement itself runs only where a GPU is (the last test)."""

import pytest
import torch

from servelab.engine import EngineConfig
from servelab.engine import gpu_memory
from servelab.engine.gpu_memory import GpuMemory, kv_blocks_for_gpu
from servelab.engine.model_runner import ModelRunner, blocks_from_gpu_memory
from servelab.model import LlamaConfig, LlamaForCausalLM
from servelab.server.__main__ import build_parser, engine_kwargs

GiB = 2**30


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=128)).eval()


def test_blocks_are_what_the_fraction_leaves_after_weights_and_activations():
    # an 80 GiB card at 0.9: 72 GiB, minus 16 GiB of weights and 2 GiB of activation peak, in 2 MiB blocks
    assert kv_blocks_for_gpu(80 * GiB, 0.9, 16 * GiB, 2 * GiB, 2 * 2**20) == int(80 * GiB * 0.9 - 18 * GiB) // 2**20 // 2
    assert kv_blocks_for_gpu(1000, 1.0, 100, 50, 100) == 8  # 850 bytes left: 8 whole blocks, the rest unused
    assert kv_blocks_for_gpu(1000, 0.5, 100, 50, 100) == 3  # 350 bytes left
    assert kv_blocks_for_gpu(1000, 0.25, 100, 50, 100) == 1  # exactly one block


def test_a_fraction_with_no_room_for_one_block_is_a_clear_error():
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.2 leaves 50 bytes .* one KV block needs 100 bytes"):
        kv_blocks_for_gpu(1000, 0.2, 100, 50, 100)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.1 leaves -50 bytes"):  # weights alone overflow
        kv_blocks_for_gpu(1000, 0.1, 100, 50, 100)


@pytest.mark.parametrize("value, error", [(0.0, ValueError), (1.5, ValueError), (-0.1, ValueError),
                                          (float("nan"), ValueError), (True, TypeError), ("0.9", TypeError)])
def test_gpu_memory_utilization_must_be_a_fraction_in_0_1(value, error):
    with pytest.raises(error, match=r"gpu_memory_utilization must be .*\(0.0, 1.0\]"):
        EngineConfig(gpu_memory_utilization=value)
    assert EngineConfig(gpu_memory_utilization=1.0).gpu_memory_utilization == 1.0


def test_on_the_cpu_the_fraction_changes_nothing():
    budget = EngineConfig(device="cpu", block_size=8, kv_cache_memory_bytes=2**20)
    sized = EngineConfig(device="cpu", block_size=8, kv_cache_memory_bytes=2**20, gpu_memory_utilization=0.01)
    assert ModelRunner(tiny_model(), sized).num_blocks == ModelRunner(tiny_model(), budget).num_blocks
    assert ModelRunner(tiny_model(), budget).num_blocks == budget.kv_cache_memory_bytes // (2 * 2 * 8 * 2 * 8 * 4)
    default, fraction = EngineConfig(device="cpu", block_size=8), EngineConfig(device="cpu", block_size=8,
                                                                               gpu_memory_utilization=0.01)
    assert ModelRunner(tiny_model(), default).num_blocks == ModelRunner(tiny_model(), fraction).num_blocks


def test_gpu_sizing_profiles_a_full_budget_pass_then_divides_what_is_left(monkeypatch):
    """The CUDA path with its measurement replaced: the profiling pass really runs (here on the CPU) with
    ``max_num_batched_tokens`` tokens, and the pool gets the blocks the reported figures leave."""
    batches = []
    execute = ModelRunner.execute

    def spy(self, batch):
        batches.append((len(batch.token_ids), len(batch.sample_indices)))
        return execute(self, batch)

    def fake_measure(device, profile):
        profile()
        return GpuMemory(total_bytes=10 * 2**20, used_bytes=2 * 2**20, activation_peak_bytes=2**20)

    config = EngineConfig(device="cpu", block_size=8, max_num_batched_tokens=100, max_num_seqs=4,
                          gpu_memory_utilization=0.5)
    runner = ModelRunner(tiny_model(), config)
    monkeypatch.setattr(gpu_memory, "measure_cuda_memory", fake_measure)
    monkeypatch.setattr(ModelRunner, "execute", spy)
    blocks = blocks_from_gpu_memory(runner, config)
    assert batches == [(100, 4)]  # the whole token budget in one pass, max_num_seqs rows through the LM head
    assert blocks == (5 * 2**20 - 3 * 2**20) // runner.bytes_per_block
    unset = EngineConfig(device="cpu", block_size=8, max_num_batched_tokens=100, max_num_seqs=4)
    assert blocks_from_gpu_memory(runner, unset) == (9 * 2**20 - 3 * 2**20) // runner.bytes_per_block


def test_server_flag_reaches_the_engine_config():
    args = build_parser().parse_args(["--gpu-memory-utilization", "0.85", "--max-num-seqs", "8"])
    assert engine_kwargs(args) == {"gpu_memory_utilization": 0.85, "max_num_seqs": 8}
    assert EngineConfig(**engine_kwargs(args)).gpu_memory_utilization == 0.85
    assert "gpu_memory_utilization" not in engine_kwargs(build_parser().parse_args([]))


def test_on_cuda_the_pool_takes_what_the_fraction_leaves(engine_device):
    """The real measurement (run by ``tools/gpu_check.sh``, which runs ``tests/test_engine*.py`` on CUDA):
    a fraction 5 % above what the device already holds gives a pool of about 5 % of its memory, and a
    fraction below what it holds is the clear error."""
    if engine_device != "cuda":
        pytest.skip("needs a CUDA GPU")
    free, total = torch.cuda.mem_get_info()
    held = (total - free) / total
    fraction = min(1.0, held + 0.05)
    runner = ModelRunner(tiny_model(), EngineConfig(device="cuda", block_size=16, gpu_memory_utilization=fraction))
    room = total * fraction - (total - free)
    assert 0.5 * room <= runner.num_blocks * runner.bytes_per_block <= room
    del runner
    torch.cuda.empty_cache()
    with pytest.raises(ValueError, match="gpu_memory_utilization=.* leaves .* one KV block needs"):
        ModelRunner(tiny_model(), EngineConfig(device="cuda", gpu_memory_utilization=held / 2))
