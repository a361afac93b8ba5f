"""Every way a request leaves the engine (finished by length, EOS or a stop string, cancelled,
aborted, timed out, failed in the forward pass, failed as unschedulable, while waiting, running,
paused or swapped out, one sample or n) goes through §0's
``servelab.lifecycle.state_machine.reclaim``, once, and leaves every KV block, reservation, batch
slot and host swap block free."""

import pytest
import torch

import servelab.engine.engine as engine_module
from servelab.engine import EngineConfig, LLMEngine
from servelab.engine.swap import HostSwapSpace
from servelab.lifecycle.state_machine import RequestState, SlotPool, reclaim
from servelab.model import LlamaConfig, LlamaForCausalLM, train_tokenizer
from servelab.sampling import SamplingParams

torch.set_num_threads(1)

VOCAB = 300
EOS = 0
TEXT = (
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 20
)
LONG = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXT, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      eos_token_id=EOS, bos_token_id=EOS, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def reclaimed(monkeypatch) -> list[tuple[str, RequestState, RequestState]]:
    """``(request id, state left, terminal state)`` of each reclaim the engine called."""
    calls = []

    def spy(lifecycle, terminal_state, **kwargs):
        calls.append((lifecycle.request_id, lifecycle.state, terminal_state))
        return reclaim(lifecycle, terminal_state, **kwargs)

    monkeypatch.setattr(engine_module, "reclaim", spy)
    return calls


def make_engine(model, tokenizer, now=None, **overrides) -> LLMEngine:
    settings = {"dtype": "float32", "block_size": 4, "max_model_len": 128} | overrides
    clock = (lambda: now[0]) if now is not None else None
    return LLMEngine(
        model, tokenizer, EngineConfig(**settings), **({"clock": clock} if clock else {})
    )


def drain(engine: LLMEngine) -> None:
    for _ in range(500):
        if not engine.has_unfinished():
            return
        engine.step()
    raise AssertionError("the engine did not finish")


def assert_all_free(engine: LLMEngine, reclaimed, ended: int) -> None:
    """One reclaim per ended request, one ledger record each, and nothing held."""
    assert sorted(r for r, _, _ in reclaimed) == sorted(r.request_id for r in engine.ledger.records)
    assert len(reclaimed) == len({r for r, _, _ in reclaimed}) == ended
    for request_id, _, terminal in reclaimed:
        assert engine.ledger.get(request_id).state is terminal
    alloc = engine.allocator
    alloc.inspect().check_invariants()
    assert alloc.num_used_blocks == 0 and alloc.num_reserved_blocks == 0
    assert all(alloc.refcount(b) == 0 for b in range(alloc.num_blocks))
    assert engine.slots.in_use == 0
    swap = engine.runner.host_swap
    assert swap is None or swap.in_use == 0
    assert (
        not engine.scheduler.running
        and not engine.scheduler.waiting
        and not engine.scheduler.swapped
    )


def test_finished_by_length_eos_and_stop_string(model, tokenizer, reclaimed):
    engine = make_engine(model, tokenizer)
    engine.add_request(
        "To be, or", SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True), "length"
    )
    engine.add_request(
        "Whether", SamplingParams(temperature=1.0, max_tokens=60, seed=1), "eos-or-length"
    )
    engine.add_request(
        "To be",
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=(" ",)),
        "stop",
    )
    drain(engine)
    assert {r.request_id: r.state for r in engine.ledger.records} == dict.fromkeys(
        ["length", "eos-or-length", "stop"], RequestState.FINISHED)
    assert all(left in (RequestState.PREFILL, RequestState.DECODE) for _, left, _ in reclaimed)
    assert_all_free(engine, reclaimed, 3)


def test_cancelled_and_aborted_waiting_running_and_paused(model, tokenizer, reclaimed):
    engine = make_engine(model, tokenizer, max_num_seqs=2)
    ids = [engine.add_request(f"To be {i}", LONG) for i in range(5)]
    engine.step()
    engine.step()
    engine.pause(ids[1])
    engine.step()
    assert engine.cancel(ids[0]) and engine.cancel(ids[1]) and engine.abort(ids[4])
    drain(engine)
    left = {request_id: state for request_id, state, _ in reclaimed}
    assert left[ids[0]] is RequestState.DECODE and left[ids[1]] is RequestState.BACKPRESSURED
    assert left[ids[4]] is RequestState.VALIDATED
    assert_all_free(engine, reclaimed, 5)


def test_timed_out_and_failed(model, tokenizer, reclaimed):
    now = [0.0]
    engine = make_engine(model, tokenizer, now)
    late = engine.add_request("To be", LONG, deadline_s=1.0)
    engine.step()
    now[0] = 2.0
    engine.step()
    doomed = engine.add_request("Whether", LONG)
    engine.runner.execute = lambda batch: (_ for _ in ()).throw(RuntimeError("device lost"))
    engine.step()
    assert (engine.ledger.get(late).state, engine.ledger.get(doomed).state) == (
        RequestState.TIMED_OUT,
        RequestState.FAILED,
    )
    assert_all_free(engine, reclaimed, 2)


def test_n_samples_and_swapped_out_requests(model, tokenizer, reclaimed):
    engine = make_engine(
        model, tokenizer, num_blocks=16, max_num_batched_tokens=16, preemption_mode="swap"
    )
    assert isinstance(engine.runner.host_swap, HostSwapSpace) and isinstance(
        engine.runner.host_swap, SlotPool
    )
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, n=2)
    ids = [engine.add_request(f"To be, or not to be {i}", params) for i in range(4)]
    swapped = None
    for _ in range(200):
        engine.step()
        if engine.scheduler.swapped:
            swapped = engine.scheduler.swapped[0].request.request_id
            break
    assert swapped is not None, "the tiny pool should have swapped a sequence out"
    assert engine.runner.host_swap.in_use > 0
    engine.cancel(swapped)
    drain(engine)
    assert engine.ledger.get(swapped).swap_released > 0
    assert_all_free(engine, reclaimed, len(ids))


def test_an_unschedulable_request_fails_through_reclaim(model, tokenizer, reclaimed, monkeypatch):
    engine = make_engine(model, tokenizer)
    # never admitted
    monkeypatch.setattr(engine.allocator, "reserve", lambda *args, **kwargs: False)
    stuck = engine.add_request("To be", LONG)
    drain(engine)
    assert engine.ledger.get(stuck).state is RequestState.FAILED
    assert reclaimed == [(stuck, RequestState.VALIDATED, RequestState.FAILED)]
    assert_all_free(engine, reclaimed, 1)
