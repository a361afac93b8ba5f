"""The load generator against a server the course did not write: transformers' `transformers serve` (an
OpenAI-compatible FastAPI server, from the package index) serving the shipped model from a local folder on
127.0.0.1, offline, on the CPU. Skipped where its serving extras (fastapi, uvicorn) are not installed."""

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from servelab.loadgen.__main__ import main as loadgen_main
from servelab.model.checkpoint import default_model_dir

MISSING = [m for m in ("transformers", "fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"`transformers serve` needs {', '.join(MISSING)}: "
                                "pip install 'transformers[serving]'")
START_S = 240.0
CLI = "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; sys.exit(main())"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hf_folder(path):
    """The shipped model as a plain Hugging Face folder: its config, weights and tokenizer, plus the
    tokenizer_config.json that tells AutoTokenizer which class and end token to use."""
    path.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(default_model_dir() / name, path / name)
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
         "model_max_length": 256}))
    return path


def wait_until_up(proc: subprocess.Popen, url: str, log_path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"transformers serve exited with {proc.returncode}:\n{log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    pytest.fail(f"transformers serve did not answer within {START_S:.0f} s:\n{log_path.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def transformers_server(tmp_path_factory):
    folder = hf_folder(tmp_path_factory.mktemp("hf") / "shakespeare")
    port = free_port()
    log_path = folder.parent / "serve.log"
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", CLI, "serve", str(folder), "--device", "cpu", "--host",
                                 "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        wait_until_up(proc, url, log_path)
        yield url, str(folder)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_vllm_command_line_against_transformers_serve(transformers_server, tmp_path):
    url, model = transformers_server
    loadgen_main(["--url", url, "--no-ignore-eos", "--dataset-name", "random", "--random-input-len", "8",
                  "--random-output-len", "8", "--num-prompts", "6", "--request-rate", "20", "--max-concurrency", "2",
                  "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90", "--save-result",
                  "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", "tf.json"])
    result = json.loads((tmp_path / "tf.json").read_text())
    assert result["model_id"] == model  # discovered from its /v1/models
    assert result["completed"] == 6 and result["errors"] == [""] * 6, result["errors"]
    # it streams one token per chunk and ends with a finish_reason (no [DONE]); usage gives the counts
    assert all(0 < len(itl) + 1 <= n <= 8 for itl, n in zip(result["itls"], result["output_lens"]))
    assert result["total_output_tokens"] == sum(result["output_lens"])
    assert result["mean_ttft_ms"] == pytest.approx(np.mean(result["ttfts"]) * 1000)
    assert result["p90_e2el_ms"] == pytest.approx(np.percentile(result["latencies"], 90) * 1000)
    assert 1 <= result["max_concurrent_requests"] <= 2


def test_transformers_serve_refuses_ignore_eos(transformers_server):
    """It rejects fields it does not know, so a vLLM/SGLang extension such as ignore_eos fails the request."""
    url, _ = transformers_server
    result = loadgen_main(["--url", url, "--ignore-eos", "--num-prompts", "1", "--random-input-len", "4",
                           "--random-output-len", "2", "--save-detailed"])
    assert result["failed"] == 1 and "ignore_eos" in result["errors"][0]
