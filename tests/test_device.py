"""The one device rule: arguments, then SERVELAB_DEVICE / SERVELAB_DTYPE, then CUDA + bf16 or CPU + fp32."""

import contextlib

import pytest
import torch

from servelab.device import DEVICE_ENV, DTYPE_ENV, describe_device, pick_device
from servelab.engine import EngineConfig
from servelab.bench.cli import main
from servelab.bench.engine_bench import engine_config, hardware
from servelab.device import resolve_device_dtype
from servelab.model import LlamaConfig, LlamaForCausalLM


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    monkeypatch.delenv(DTYPE_ENV, raising=False)


def test_default_follows_the_hardware():
    gpu = torch.cuda.is_available()
    expected = (torch.device("cuda"), torch.bfloat16) if gpu else (torch.device("cpu"), torch.float32)
    assert pick_device() == expected


def test_arguments_beat_environment_and_environment_beats_default(monkeypatch):
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")
    assert pick_device("cpu") == (torch.device("cpu"), torch.bfloat16)
    assert pick_device("cpu", "float32") == (torch.device("cpu"), torch.float32)
    assert pick_device(torch.device("cpu"), torch.float16) == (torch.device("cpu"), torch.float16)
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    monkeypatch.delenv(DTYPE_ENV)
    assert pick_device() == (torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("env, value, match", [
    (DEVICE_ENV, "gpu", "SERVELAB_DEVICE must be one of 'cpu', 'cuda', 'cuda:N', got 'gpu'"),
    (DEVICE_ENV, "mps", "SERVELAB_DEVICE must be one of"),
    (DTYPE_ENV, "fp8", r"SERVELAB_DTYPE must be one of \('float32', 'bfloat16', 'float16'\), got 'fp8'"),
])
def test_bad_environment_names_the_variable(monkeypatch, env, value, match):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=match):
        pick_device()


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="device must be one of"):
        pick_device("tpu-9")
    with pytest.raises(ValueError, match="dtype must be one of"):
        pick_device("cpu", "int8")
    with pytest.raises(ValueError, match="dtype must be one of"):
        pick_device("cpu", torch.int64)
    with pytest.raises(TypeError, match="device must be a non-empty str"):
        pick_device(3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_is_refused_where_there_is_none(monkeypatch, capsys):
    with pytest.raises(ValueError, match="no CUDA GPU"):
        pick_device("cuda")
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    with pytest.raises(ValueError, match="SERVELAB_DEVICE is 'cuda' but torch sees no CUDA GPU"):
        resolve_device_dtype(EngineConfig())
    with pytest.raises(SystemExit):
        main(["--device", "cuda", "--quick"])
    assert "no CUDA GPU" in capsys.readouterr().err


def test_engine_and_benchmark_use_the_rule(monkeypatch):
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")
    assert resolve_device_dtype(EngineConfig(device="cpu")) == (torch.device("cpu"), torch.bfloat16)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    model.to(torch.bfloat16)
    config = engine_config(model, max_num_seqs=3)
    assert (config.device, config.dtype, config.max_num_seqs, config.enable_prefix_caching) == \
        ("cpu", "bfloat16", 3, False)
    record = hardware(torch.device("cpu"), torch.bfloat16)
    assert (record["device"], record["dtype"], record["gpu"], record["torch"]) == \
        ("cpu", "bfloat16", None, torch.__version__)
    assert describe_device(torch.device("cpu"))["cpu"]


def test_model_takes_ids_built_on_the_cpu_wherever_it_lives():
    """Token ids made with a bare ``torch.tensor`` (on the CPU) reach a model on another device; the
    ``meta`` device stands in for a GPU here."""
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    logits = model(ids, positions=torch.arange(3).expand(2, 3))
    assert logits.device.type == "meta" and logits.shape == (2, 3, 300)


def test_engine_config_takes_what_pick_device_returns_as_plain_names():
    from servelab.engine.config import EngineConfig

    device, dtype = pick_device("cpu", "bfloat16")  # what a notebook's set-up cell holds in DEVICE, DTYPE
    config = EngineConfig(device=device, dtype=dtype)
    assert (config.device, config.dtype) == ("cpu", "bfloat16")
    with pytest.raises(TypeError, match="device must be a str"):
        EngineConfig(device=3)


def test_engine_keeps_a_given_model_where_its_caller_put_it(monkeypatch):
    """Unset device/dtype follow the model, not the environment: the engine never casts a caller's model."""
    monkeypatch.setenv(DTYPE_ENV, "bfloat16")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    assert resolve_device_dtype(EngineConfig(), model) == (torch.device("cpu"), torch.float32)
    assert resolve_device_dtype(EngineConfig()) == (torch.device("cpu"), torch.bfloat16)  # no model: the rule
    assert resolve_device_dtype(EngineConfig(dtype="bfloat16"), model)[1] == torch.bfloat16  # asked for


def test_cuda_default_dtype_asks_for_native_bf16(monkeypatch):
    """A GPU that can only emulate bf16 (a T4) gets float16; one with native bf16 gets bfloat16."""
    import servelab.device as device

    monkeypatch.delenv(device.DTYPE_ENV, raising=False)
    monkeypatch.setattr(device, "_device", lambda value, name: torch.device("cuda"))
    for native, expected in ((False, torch.float16), (True, torch.bfloat16)):
        asked = []
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True, native=native: asked.append(including_emulation) or native)
        monkeypatch.setattr(torch.cuda, "device", lambda where: contextlib.nullcontext())
        assert device.pick_device()[1] == expected
        assert asked == [False]
