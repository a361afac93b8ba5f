"""The queue policies inside the engine: SJF with aging and per-tenant fair queuing change the order in
which waiting requests are admitted, the way they do in the tick simulators; names are validated."""

import pytest
import torch

from servelab.engine import EngineConfig, LLMEngine
from servelab.model import LlamaConfig, LlamaForCausalLM, train_tokenizer
from servelab.scheduling.queue_policy import ENGINE_POLICIES
from servelab.sampling import SamplingParams

torch.set_num_threads(1)

VOCAB = 300


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer("To be, or not to be, that is the question:\n" * 20, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      eos_token_id=0, bos_token_id=0, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def tokens(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def one_slot(model, tokenizer, policy: str, **config) -> LLMEngine:
    """One batch slot: requests are admitted strictly one after another, in the policy's order."""
    return LLMEngine(model, tokenizer, EngineConfig(dtype="float32", device="cpu", max_num_seqs=1, policy=policy,
                                                    trace_steps=0, **config))


def admission_order(engine: LLMEngine, arrivals: dict[int, list[tuple[str, int, str]]]) -> list[str]:
    """Step the engine, adding ``(request_id, max_tokens, tenant)`` requests before the step numbered by
    their key; returns request ids in the order steps admitted them."""
    order, step = [], 0
    while step <= max(arrivals) or engine.has_unfinished():
        for request_id, max_tokens, tenant in arrivals.get(step, []):
            engine.add_request([5, 6, 7], tokens(max_tokens), request_id=request_id, tenant=tenant)
        order += [r for r in engine.step().admitted if r not in order]
        step += 1
    return order


def test_sjf_aging_lifts_a_long_request_that_has_waited(model, tokenizer):
    # "long" waits from step 1, "short" arrives 4 ticks later; the blocker holds the only slot meanwhile
    arrivals = {0: [("blocker", 8, "")], 1: [("long", 8, "")], 5: [("short", 3, "")]}
    assert admission_order(one_slot(model, tokenizer, "sjf"), arrivals) == ["blocker", "short", "long"]
    assert admission_order(one_slot(model, tokenizer, "sjf-aging", aging_rate=0.0), arrivals) == [
        "blocker", "short", "long"]  # rate 0 is plain SJF
    # rate 2: long's rank 8 - 2 * waited beats short's 3 - 2 * waited once it has waited 3 ticks longer
    assert admission_order(one_slot(model, tokenizer, "sjf-aging", aging_rate=2.0), arrivals) == [
        "blocker", "long", "short"]


def test_the_scheduler_counts_waiting_in_ticks(model, tokenizer):
    engine = one_slot(model, tokenizer, "sjf-aging")
    engine.add_request([5, 6], tokens(4), request_id="a")
    engine.add_request([5, 6], tokens(4), request_id="b")
    for _ in range(3):
        engine.step()
    assert engine.scheduler.ticks == 3
    waiting = engine.scheduler.waiting
    assert [s.seq_id for s in waiting] == ["b"] and waiting[0].waited == 3  # queued at tick 0, 3 ticks ago


def test_fair_queuing_serves_a_quiet_tenant_before_a_busy_one(model, tokenizer):
    arrivals = {0: [("a1", 4, "A"), ("a2", 4, "A"), ("a3", 4, "A")], 1: [("b1", 4, "B")]}
    assert admission_order(one_slot(model, tokenizer, "fcfs"), arrivals) == ["a1", "a2", "a3", "b1"]
    engine = one_slot(model, tokenizer, "fair-queuing")
    assert admission_order(engine, arrivals) == ["a1", "b1", "a2", "a3"]  # B had 0 tokens served, A had 4
    assert engine.scheduler.served == {"A": 12, "B": 4}  # one token per sampled position


def test_fair_queuing_tenant_defaults_to_the_namespace(model, tokenizer):
    engine = one_slot(model, tokenizer, "fair-queuing")
    engine.add_request([5, 6], tokens(2), namespace="acme")
    engine.add_request([5, 6], tokens(2), namespace="acme", tenant="other")
    assert [s.tenant for s in engine.scheduler.waiting] == ["acme", "other"]
    with pytest.raises(TypeError, match="tenant"):
        engine.add_request([5, 6], tokens(2), tenant=3)


def test_policy_names_are_validated():
    assert ENGINE_POLICIES == ("fcfs", "priority", "sjf", "sjf-aging", "fair-queuing")
    with pytest.raises(ValueError, match=r"policy must be one of \('fcfs', 'priority', 'sjf', 'sjf-aging', "
                                         r"'fair-queuing'\), got 'lifo'"):
        EngineConfig(policy="lifo")
    with pytest.raises(ValueError, match="aging_rate"):
        EngineConfig(policy="sjf-aging", aging_rate=-1.0)
