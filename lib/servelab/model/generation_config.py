"""A checkpoint's default sampling settings, from its ``generation_config.json`` (vLLM's
``--generation-config auto``, its default).

Read: ``temperature``, ``top_p``, ``top_k``, ``min_p`` and ``repetition_penalty``, each only when
present and not null; ``top_k`` 0 or -1 means no top-k (Hugging Face's and vLLM's spelling) and is
dropped; ``do_sample: false`` means greedy (``temperature`` 0), as in ``transformers``'
``generate``. Every other key (``max_new_tokens``, ``bos_token_id``, ...) is ignored here; the EOS
ids are read by :func:`servelab.model.checkpoint.eos_token_ids`. These become the defaults of
requests that leave a field unset (:meth:`servelab.engine.LLMEngine.sampling_params`, and the
server's request parsing); a field a request sets keeps its own value.

System boundary: one JSON file in, a plain ``{field: value}`` dict out, each value checked by
:class:`~servelab.sampling.SamplingParams`; a bad value is a ValueError naming the file and the
field.
"""

from __future__ import annotations

import json
from pathlib import Path

from servelab.model.checkpoint import GENERATION_CONFIG_FILE
from servelab.sampling import SamplingParams

__all__ = ["SAMPLING_FIELDS", "sampling_defaults"]

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""The :class:`~servelab.sampling.SamplingParams` fields a ``generation_config.json`` may set."""


def sampling_defaults(directory: str | Path) -> dict[str, float | int]:
    """The sampling defaults of the checkpoint folder ``directory``; ``{}`` without a
    ``generation_config.json`` (the course defaults of :class:`~servelab.sampling.SamplingParams`
    stand).

    Raises:
        ValueError: the file is not a JSON object, ``do_sample`` is not a bool, or a value is out of
            :class:`~servelab.sampling.SamplingParams`' range (the message names the file and the
            field).
    """
    path = Path(directory) / GENERATION_CONFIG_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    defaults = {name: data[name] for name in SAMPLING_FIELDS if data.get(name) is not None}
    if type(defaults.get("top_k")) is int and defaults["top_k"] in (0, -1):
        del defaults["top_k"]
    do_sample = data.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ValueError(f"{path}: do_sample must be true or false, got {do_sample!r}")
    if do_sample is False:
        defaults["temperature"] = 0.0
    try:
        SamplingParams(**defaults)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    return defaults
