"""One request's inputs to one sampling step, read by the batched sampler and each of its stages.

A module of its own, below the sampler (:mod:`servelab.engine.sampler`) and its stages
(:mod:`~servelab.engine.logits_processors`, :mod:`~servelab.engine.structured`,
:mod:`~servelab.engine.truncation`), so that they share it without importing each other.
System boundary: a plain record; the engine builds one per scheduled sample per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from servelab.sampling.params import SamplingParams

__all__ = ["SamplingRow"]


@dataclass
class SamplingRow:
    """One request's inputs to one decode step."""

    params: SamplingParams
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    generator: torch.Generator  # CPU generator owned by the request
    # bool [vocab]: the ids the request's grammar allows next
    grammar_mask: torch.Tensor | None = None
