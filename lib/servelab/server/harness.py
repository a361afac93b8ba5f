"""EleutherAI's lm-evaluation-harness as a client of the course server, on local tasks only.

Two tasks are written to a folder, with their data, so lm-eval needs no network and downloads
nothing:

* ``servelab_heldout`` (``loglikelihood_rolling``): one document per play, the held-out tail of each
  play (:func:`servelab.model.corpus.train_val_text`, the text the model card's bits per character
  come from); lm-eval's ``bits_per_byte`` over it is the same figure measured by someone else's code
  through the server (the text is ASCII but for a few em dashes, so bytes are almost exactly
  characters);
* ``servelab_speeches`` (``generate_until``): the first speaker line of the first few held-out
  plays, continued greedily until ``"\\n\\n"``; the targets are what the engine generates offline
  for the same prompts, so ``exact_match`` is 1 exactly when the server and lm-eval's request path
  agree with the engine.

lm-eval's ``local-completions`` model sends ``{"prompt": [token ids], "max_tokens": 1, "logprobs":
1, "echo": true, "temperature": 0, "seed": 1234}`` for every rolling window and sums
``token_logprobs[ctxlen:-1]``; its tokenizer is the course tokenizer through
``tokenizer_backend=huggingface`` (a folder holding ``tokenizer.json`` and a small
``tokenizer_config.json`` naming ``<|endoftext|>`` as BOS, the token each rolling window starts
from). ``max_length=256`` is the model's context: lm-eval keeps one token for generation. With
``batch_size=8`` it sends one request per document (its windows batched), far under the server's
default rate limit (20 requests/s, burst 40), so the server runs with its default flags.

``python -m servelab.server.harness --out lib/servelab/data/lm_eval_cpu.json`` runs both tasks
against the shipped model and records the figures, the command and the hardware (the model card
reads that file).

System boundary: files in a folder and HTTP to a running server; needs the ``lm-eval[api]`` package.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from servelab.model.corpus import train_val_text
from servelab.model.tokenizer import END_OF_TEXT
from servelab.sampling import SamplingParams

__all__ = [
    "HELDOUT_TASK",
    "SPEECH_TASK",
    "heldout_docs",
    "write_tasks",
    "lm_eval_command",
    "run_lm_eval",
]

HELDOUT_TASK = "servelab_heldout"
SPEECH_TASK = "servelab_speeches"
MAX_LENGTH = 256  # the shipped model's context (tokens)
SPEECH_STOP = "\n\n"
SPEECH_TOKENS = 32
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}


def heldout_docs() -> list[str]:
    """The held-out tail of every play, in corpus order (the model card's validation text)."""
    _, val = train_val_text(separator=END_OF_TEXT)
    return [doc for doc in val.split(END_OF_TEXT) if doc]


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _task_yaml(name: str, data: Path, body: str) -> str:
    return (
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: "
        f"{json.dumps(str(data))}\n"
        f"test_split: test\n{body}"
    )


def write_tasks(folder: Path, engine, tokenizer_json: Path, num_speeches: int = 5) -> Path:
    """Write both tasks, their data and the tokenizer folder under ``folder``; returns the tokenizer
    folder.

    The speech targets are ``engine``'s own greedy continuations (offline, before any server runs).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    docs = heldout_docs()
    _jsonl(folder / "heldout.jsonl", [{"text": doc} for doc in docs])
    prompts = [doc[:doc.index(":\n") + 2] for doc in docs[:num_speeches]]
    params = SamplingParams(temperature=0, max_tokens=SPEECH_TOKENS, stop=(SPEECH_STOP,))
    targets = [out.text for out in engine.generate(prompts, params)]
    _jsonl(
        folder / "speeches.jsonl", [{"prompt": p, "target": t} for p, t in zip(prompts, targets)]
    )
    (folder / f"{HELDOUT_TASK}.yaml").write_text(
        _task_yaml(
            HELDOUT_TASK,
            folder / "heldout.jsonl",
            'output_type: loglikelihood_rolling\ndoc_to_text: ""\n'
            'doc_to_target: "{{text}}"\nmetric_list:\n  - metric: bits_per_byte\n    '
            'aggregation: bits_per_byte\n'
            "    higher_is_better: false\n",
        )
    )
    (folder / f"{SPEECH_TASK}.yaml").write_text(
        _task_yaml(
            SPEECH_TASK,
            folder / "speeches.jsonl",
            'output_type: generate_until\ndoc_to_text: "{{prompt}}"\n'
            f'doc_to_target: "{{{{target}}}}"\ngeneration_kwargs:\n  until: '
            f'[{json.dumps(SPEECH_STOP)}]\n'
            f"  max_gen_toks: {SPEECH_TOKENS}\n  do_sample: false\n  temperature: 0\n"
            "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    "
            "higher_is_better: true\n",
        )
    )
    tokenizer = folder / "tokenizer"
    tokenizer.mkdir(exist_ok=True)
    shutil.copyfile(tokenizer_json, tokenizer / "tokenizer.json")
    (tokenizer / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": END_OF_TEXT,
                "eos_token": END_OF_TEXT,
                "model_max_length": MAX_LENGTH,
            }
        )
    )
    return tokenizer


def _model_args(base_url: str, model_name: str, tokenizer: Path, batch_size: int) -> dict:
    return {
        "base_url": base_url.rstrip("/") + "/completions",
        "model": model_name,
        "tokenizer": str(tokenizer),
        "tokenizer_backend": "huggingface",
        "max_length": MAX_LENGTH,
        "batch_size": batch_size,
        "max_retries": 1,
    }


def lm_eval_command(
    base_url: str, model_name: str, folder: Path, tokenizer: Path, batch_size: int = 8
) -> str:
    """The ``lm_eval`` command line equivalent to :func:`run_lm_eval`."""
    args = ",".join(
        f"{k}={v}"
        for k, v in _model_args(base_url, model_name, tokenizer, batch_size).items()
        if k != "batch_size"
    )
    return (
        f"lm_eval --model local-completions --model_args {args} --tasks "
        f"{HELDOUT_TASK},{SPEECH_TASK} "
        f"--include_path {folder} --batch_size {batch_size}"
    )


def run_lm_eval(
    base_url: str, model_name: str, folder: Path, tokenizer: Path, batch_size: int = 8
) -> dict:
    """Run both tasks through lm-eval against the server at ``base_url`` (``.../v1``).

    Returns ``bits_per_byte``, ``exact_match``, the document counts and the wall time (seconds).
    """
    os.environ.update(OFFLINE)
    import lm_eval
    from lm_eval.tasks import TaskManager

    start = time.perf_counter()
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=_model_args(base_url, model_name, tokenizer, batch_size),
        tasks=[HELDOUT_TASK, SPEECH_TASK],
        task_manager=TaskManager(include_path=str(folder), include_defaults=False),
        log_samples=False,
    )
    seconds = time.perf_counter() - start
    found = results["results"]
    return {"bits_per_byte": found[HELDOUT_TASK]["bits_per_byte,none"],
            "exact_match": found[SPEECH_TASK]["exact_match,none"],
            "documents": results["n-samples"][HELDOUT_TASK]["effective"],
            "speeches": results["n-samples"][SPEECH_TASK]["effective"], "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    """Serve the shipped model with the server's default flags, run both tasks, write ``--out``."""
    import tempfile

    import torch

    from servelab.engine import LLMEngine
    from servelab.bench.engine_bench import hardware
    from servelab.model.checkpoint import default_model_dir
    from servelab.server import BackgroundServer, ServerConfig

    parser = argparse.ArgumentParser(
        prog="python -m servelab.server.harness", description=main.__doc__
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the figures")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = LLMEngine.from_pretrained()
    card = json.loads((default_model_dir() / "training.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = write_tasks(Path(tmp), engine, default_model_dir() / "tokenizer.json")
        with BackgroundServer(engine, ServerConfig()) as server:
            found = run_lm_eval(server.url, server.config.model_name, Path(tmp), tokenizer)
            command = lm_eval_command(
                "http://127.0.0.1:8000/v1",
                server.config.model_name,
                Path("TASKS"),
                Path("TASKS/tokenizer"),
            )
    record = found | {"card_bits_per_char": card["bits_per_char"], "command": command,
                      "server_command": "python -m servelab.server",
                      "hardware": hardware(engine.runner.device, engine.runner.dtype)}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
