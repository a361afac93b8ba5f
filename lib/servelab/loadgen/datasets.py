"""Prompt sources of ``vllm bench serve``: ``random``, ``sharegpt`` (JSON) and ``custom`` (JSONL).

Each source returns ``num_prompts`` :class:`Sample` s, seeded, in the order they will be sent; pair
them with arrival offsets in :func:`specs_from_samples`.

* ``random``: prompt and output lengths drawn uniformly from the integers in
  ``[floor(L(1 - r)), ceil(L(1 + r))]`` around ``--random-input-len`` / ``--random-output-len``
  with ``r = --random-range-ratio`` (vLLM's rule; output length at least 1);
* ``sharegpt``: a JSON list of ``{"conversations": [{"from": "human", "value": ...},
  {"from": "gpt", "value": ...}, ...]}``; the first turn is the prompt, the second turn's length
  the output length (unless ``--sharegpt-output-len``). As in vLLM, entries with fewer than two
  turns are dropped, and so are pairs with a prompt or reply shorter than 4, a prompt longer than
  1024 or both together longer than 2048;
* ``custom``: JSONL, one ``{"prompt": ...}`` per line; an optional integer ``"output_tokens"``
  overrides ``--custom-output-len`` for that line (an extension: vLLM gives every line the same).

File datasets are shuffled with the seed (unless ``shuffle=False``) and, when they hold fewer usable
entries than ``num_prompts``, topped up with entries drawn again at random (vLLM's oversampling).

System boundary: the client, which has no tokenizer. Lengths are counted in whitespace-separated
words where vLLM counts tokens of the model's tokenizer; output lengths become ``max_tokens`` (real
tokens on the server), and the server's ``usage.prompt_tokens`` reports a prompt's true length.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab._validate import require_int
from servelab.loadgen.workload import RequestSpec, make_prompt

__all__ = [
    "DATASET_NAMES",
    "Sample",
    "random_samples",
    "sharegpt_samples",
    "custom_samples",
    "load_samples",
    "specs_from_samples",
]

DATASET_NAMES = ("random", "sharegpt", "custom")
MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048  # vLLM's is_valid_sequence bounds


@dataclass(frozen=True)
class Sample:
    """One prompt and how many tokens to ask for (``max_tokens``)."""

    prompt: str
    output_len: int


def _length_range(length: int, ratio: float, low_floor: int) -> tuple[int, int]:
    return max(math.floor(length * (1 - ratio)), low_floor), max(
        math.ceil(length * (1 + ratio)), low_floor
    )


def random_samples(num_prompts: int, input_len: int, output_len: int, range_ratio: float,
                   seed: int) -> list[Sample]:
    """Synthetic prompts of words from the course word list, lengths uniform around the means."""
    require_int("--num-prompts", num_prompts, 1)
    require_int("--random-input-len", input_len, 1)
    require_int("--random-output-len", output_len, 1)
    if (
        isinstance(range_ratio, bool)
        or not isinstance(range_ratio, (int, float))
        or not 0 <= range_ratio < 1
    ):
        raise ValueError(f"--random-range-ratio must be a number in [0, 1), got {range_ratio!r}")
    rng = np.random.default_rng(seed)
    in_low, in_high = _length_range(input_len, range_ratio, 1)
    out_low, out_high = _length_range(output_len, range_ratio, 1)
    inputs = rng.integers(in_low, in_high + 1, size=num_prompts)
    outputs = rng.integers(out_low, out_high + 1, size=num_prompts)
    return [Sample(make_prompt(int(n), rng), int(o)) for n, o in zip(inputs, outputs)]


def _words(text: str) -> int:
    return len(text.split())


def _shuffled_topped_up(samples: list[Sample], num_prompts: int, seed: int, shuffle: bool,
                        path: str) -> list[Sample]:
    if not samples:
        raise ValueError(f"--dataset-path {path} holds no usable entry")
    rng = np.random.default_rng(seed)
    if shuffle:
        samples = [samples[i] for i in rng.permutation(len(samples))]
    samples = samples[:num_prompts]
    extra = rng.integers(0, len(samples), size=num_prompts - len(samples))
    return samples + [samples[i] for i in extra]


def sharegpt_samples(path: str | Path, num_prompts: int, seed: int, output_len: int | None = None,
                     shuffle: bool = True) -> list[Sample]:
    """Samples from a ShareGPT-format JSON file (see the module docstring for the format and
    filter)."""
    require_int("--num-prompts", num_prompts, 1)
    if output_len is not None:
        require_int("--sharegpt-output-len", output_len, 1)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"--dataset-path {path} is not a readable ShareGPT JSON file: {exc}"
        ) from None
    if not isinstance(data, list):
        raise ValueError(f"--dataset-path {path}: a ShareGPT file is a JSON list of conversations")
    samples = []
    for entry in data:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        prompt, reply = (str(t.get("value", "")) if isinstance(t, dict) else "" for t in turns[:2])
        wanted = _words(reply) if output_len is None else output_len
        n_prompt = _words(prompt)
        if (
            n_prompt < MIN_LEN
            or (output_len is None and wanted < MIN_LEN)
            or n_prompt > MAX_PROMPT_LEN
            or n_prompt + wanted > MAX_TOTAL_LEN
        ):
            continue
        samples.append(Sample(prompt, wanted))
    return _shuffled_topped_up(samples, num_prompts, seed, shuffle, str(path))


def custom_samples(path: str | Path, num_prompts: int, seed: int, output_len: int = 256,
                   shuffle: bool = True) -> list[Sample]:
    """Samples from a JSONL file of ``{"prompt": ..., "output_tokens": N (optional)}`` lines."""
    require_int("--num-prompts", num_prompts, 1)
    require_int("--custom-output-len", output_len, 1)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"--dataset-path {path} cannot be read: {exc}") from None
    samples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise ValueError(f"--dataset-path {path} line {number} is not JSON") from None
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("prompt"), str)
            or not item["prompt"]
        ):
            raise ValueError(
                f"--dataset-path {path} line {number} needs a non-empty string \"prompt\""
            )
        wanted = item.get("output_tokens", output_len)
        if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
            raise ValueError(
                f"--dataset-path {path} line {number}: \"output_tokens\" must be an int >= 1, "
                f"got {wanted!r}"
            )
        samples.append(Sample(item["prompt"], wanted))
    return _shuffled_topped_up(samples, num_prompts, seed, shuffle, str(path))


def load_samples(
    name: str,
    num_prompts: int,
    seed: int,
    path: str | None = None,
    *,
    random_input_len: int = 1024,
    random_output_len: int = 128,
    random_range_ratio: float = 0.0,
    sharegpt_output_len: int | None = None,
    custom_output_len: int = 256,
    shuffle: bool = True,
) -> list[Sample]:
    """``num_prompts`` samples from the dataset ``name`` (``--dataset-name``), with vLLM's
    defaults."""
    if name not in DATASET_NAMES:
        raise ValueError(f"--dataset-name must be one of {', '.join(DATASET_NAMES)}, got {name!r}")
    if name == "random":
        if path is not None:
            raise ValueError(
                "--dataset-name random takes no --dataset-path (use sharegpt or custom for a file)"
            )
        return random_samples(
            num_prompts, random_input_len, random_output_len, random_range_ratio, seed
        )
    if path is None:
        raise ValueError(f"--dataset-name {name} needs --dataset-path")
    if name == "sharegpt":
        return sharegpt_samples(path, num_prompts, seed, sharegpt_output_len, shuffle)
    return custom_samples(path, num_prompts, seed, custom_output_len, shuffle)


def specs_from_samples(
    samples: Sequence[Sample], arrivals: Sequence[float | None]
) -> list[RequestSpec]:
    """One :class:`RequestSpec` per sample, planned at the matching arrival offset (or
    unplanned)."""
    if len(samples) != len(arrivals):
        raise ValueError(
            f"samples and arrivals must have the same length, got {len(samples)} and "
            f"{len(arrivals)}"
        )
    return [RequestSpec(i, None if a is None else float(a), s.prompt, s.output_len)
            for i, (s, a) in enumerate(zip(samples, arrivals))]
