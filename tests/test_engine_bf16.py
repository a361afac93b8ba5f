"""The bfloat16 path, run on the CPU so that it is not first run on a GPU: the model, the paged attention
over a bf16 KV pool, the pool itself and the sampler, each against a float32 or full-recompute twin.

Tolerances: bf16 keeps 8 significant bits (a relative step of 2**-8 = 0.0039), so logits of the same
model in bf16 and fp32, or computed in two orders in bf16, agree to a few hundredths of their spread,
not to the last digit. Greedy equality is asserted on a model whose LM head is sharpened so that the
top token leads by far more than that.
"""

import copy

import pytest
import torch

from servelab.engine import EngineConfig, LLMEngine, reference_generate
from servelab.engine.sampler import SamplingRow, sample_tokens
from servelab.engine.model_runner import ChunkSpan, ForwardInput
from servelab.model import LlamaConfig, LlamaForCausalLM, train_tokenizer
from servelab.model.llama import DenseCausalAttention
from servelab.sampling import SamplingParams

torch.set_num_threads(1)


def bf16_attention_refusal() -> str:
    """'' if this CPU's torch runs bfloat16 attention as the paged runner calls it (a causal
    grouped-query prefill and a masked decode batch), else the error it raised."""
    q, k = torch.randn(1, 4, 6, 16).bfloat16(), torch.randn(1, 2, 6, 16).bfloat16()
    try:
        torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
        torch.nn.functional.scaled_dot_product_attention(
            q[:, :2, :1], k, k, attn_mask=torch.ones(1, 1, 1, 6, dtype=torch.bool))
    except RuntimeError as error:
        return str(error).splitlines()[0]
    return ""


REFUSAL = bf16_attention_refusal()
pytestmark = pytest.mark.skipif(bool(REFUSAL), reason=f"torch cannot run bfloat16 attention on this "
                                                      f"CPU: {REFUSAL}")

VOCAB = 300
TEXT = "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n" * 20
PROMPTS = [[5, 17, 42, 99, 3], [250, 8], list(range(20, 47)), [7] * 9]
BF16_REL_TOL = 0.05  # of the fp32 logits' range


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXT, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def fp32_model():
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # clear greedy margins: bf16 rounding must not decide the argmax
        model.lm_head.weight.mul_(8)
    return model


def bf16_copy(model: LlamaForCausalLM, device: str) -> LlamaForCausalLM:
    return copy.deepcopy(model).to(device=device, dtype=torch.bfloat16)


def test_bf16_model_logits_close_to_fp32(fp32_model, engine_device):
    ids = torch.tensor([PROMPTS[2]])
    with torch.inference_mode():
        ref = copy.deepcopy(fp32_model).to(engine_device)(ids)[0]
        low = bf16_copy(fp32_model, engine_device)(ids)[0]
    assert low.dtype == torch.bfloat16 and low.device.type == engine_device
    spread = float(ref.max() - ref.min())
    error = float((low.float() - ref).abs().max())
    assert error < BF16_REL_TOL * spread
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * error  # positions where bf16 rounding cannot flip the argmax
    assert clear.any()
    assert torch.equal(low.float().argmax(-1)[clear], ref.argmax(-1)[clear])


def test_bf16_engine_greedy_matches_bf16_full_recompute(fp32_model, tokenizer, engine_device):
    """bf16 attention through PagedAttention on both paths: the prompts' prefill (several tokens per
    chunk, causal) and the batched decode steps after it."""
    model = bf16_copy(fp32_model, engine_device)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    engine = LLMEngine(model, tokenizer, EngineConfig(dtype="bfloat16", block_size=4, num_blocks=64))
    outs = engine.generate(PROMPTS, params)  # one batch: paged attention over many sequences at once
    for prompt, out in zip(PROMPTS, outs):
        assert list(out.token_ids) == reference_generate(model, prompt, 8)


def one_chunk(tokens: list[int], start: int, table: list[int]) -> ForwardInput:
    """A forward batch of one chunk: ``tokens`` from position ``start``, its last token sampled."""
    return ForwardInput(list(tokens), list(range(start, start + len(tokens))),
                        [ChunkSpan(start, len(tokens), table)], [len(tokens) - 1])


def test_bf16_paged_attention_logits_close_to_dense(fp32_model, tokenizer, engine_device):
    """Prefill logits of every prompt position through the engine's runner (bf16 pool) vs the dense model."""
    model = bf16_copy(fp32_model, engine_device)
    engine = LLMEngine(model, tokenizer, EngineConfig(dtype="bfloat16", block_size=4, num_blocks=64))
    prompt = PROMPTS[2]
    table = list(range(-(-len(prompt) // 4)))
    engine.runner.execute(one_chunk(prompt[:1], 0, table))  # position 0 fills the pool, then one per step
    paged = torch.cat([engine.runner.execute(one_chunk([token], position, table))
                       for position, token in enumerate(prompt) if position > 0])
    with torch.inference_mode():
        dense = model(torch.tensor([prompt]), backend=DenseCausalAttention())[0, 1:].float()
    spread = float(dense.max() - dense.min())
    assert paged.dtype == torch.float32  # the runner hands the sampler float32 logits
    assert float((paged - dense).abs().max()) < BF16_REL_TOL * spread


def test_bf16_kv_pool_holds_bf16_and_twice_the_blocks(fp32_model, tokenizer, engine_device):
    budget = 2**20
    engines = {dtype: LLMEngine(copy.deepcopy(fp32_model), tokenizer,
                                EngineConfig(dtype=dtype, kv_cache_memory_bytes=budget))
               for dtype in ("float32", "bfloat16")}
    low, full = engines["bfloat16"].runner, engines["float32"].runner
    assert low.cache.k.dtype == low.cache.v.dtype == torch.bfloat16
    assert low.cache.k.device.type == engine_device
    assert full.bytes_per_block == 2 * low.bytes_per_block
    assert low.num_blocks == 2 * full.num_blocks == 2 * (budget // full.bytes_per_block)


def test_sampler_on_bf16_logits(engine_device):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, VOCAB, generator=gen) * 3).to(device=engine_device, dtype=torch.bfloat16)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.9, seed=1),
              SamplingParams(temperature=1.0, top_k=5), SamplingParams(temperature=1.0, min_p=0.1),
              SamplingParams(temperature=0.0, repetition_penalty=1.3), SamplingParams(temperature=1.2)]

    def rows():
        return [SamplingRow(p, [1, 2], [3], torch.Generator().manual_seed(i)) for i, p in enumerate(params)]

    low = sample_tokens(logits, rows())
    widened = sample_tokens(logits.float(), rows())  # the same values, exactly, in float32
    assert low == widened
    assert low[0] == int(logits[0].float().argmax())
    assert all(isinstance(t, int) and 0 <= t < VOCAB for t in low)
    assert low[2] in logits[2].float().topk(5).indices.tolist()
