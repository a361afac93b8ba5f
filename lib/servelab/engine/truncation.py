"""The truncation filters of the batched sampler: top-k, top-p, min-p and typical sampling on
probability rows.

``servelab.engine.sampler`` applies each row's enabled filters in the row's ``filter_order``; rows
that share a (stage, filter) are filtered together. A default request enables none, so none of this
runs in its step. Ties are broken by the smaller token id (a stable sort), as in the reference
pipeline of ``servelab.sampling``.

System boundary: float64 probability rows ``[rows, vocab]`` in and out, renormalised; nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from servelab.sampling.params import SamplingParams
from servelab.sampling.reference import MASS_TOLERANCE

if TYPE_CHECKING:
    from servelab.engine.sampling_row import SamplingRow

__all__ = ["FILTERS", "apply_filters"]


def _param_column(params: list[SamplingParams], name: str, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(
        [float(getattr(p, name)) for p in params], dtype=torch.float64, device=like.device
    )[:, None]


def _keep_mask(probs: torch.Tensor, order: torch.Tensor, keep_sorted: torch.Tensor) -> torch.Tensor:
    """Zero the entries whose sorted position is not kept, then renormalise each row."""
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = torch.where(keep & (probs > 0), probs, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _by_probability(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted probabilities and order: highest first, ties by smaller id (stable sort)."""
    return torch.sort(probs, dim=-1, descending=True, stable=True)


def _prefix_reaching(sorted_mass: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Keep-mask over sorted positions: the shortest prefix whose sum reaches ``threshold`` (per
    row)."""
    cumulative = sorted_mass.cumsum(dim=-1)
    before = cumulative - sorted_mass  # mass strictly before each position
    return before < threshold - MASS_TOLERANCE


def _top_k(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    _, order = _by_probability(probs)
    ranks = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    return _keep_mask(probs, order, ranks < _param_column(params, "top_k", probs))


def _top_p(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    sorted_p, order = _by_probability(probs)
    return _keep_mask(
        probs, order, _prefix_reaching(sorted_p, _param_column(params, "top_p", probs))
    )


def _min_p(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    threshold = _param_column(params, "min_p", probs) * probs.max(dim=-1, keepdim=True).values
    kept = torch.where(probs >= threshold, probs, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _typical(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    positive = probs > 0
    surprisal = torch.where(positive, -torch.log(torch.where(positive, probs, 1.0)), 0.0)
    entropy = (probs * surprisal).sum(dim=-1, keepdim=True)
    distance = torch.where(positive, (surprisal - entropy).abs(), torch.inf)
    order = torch.sort(distance, dim=-1, stable=True).indices
    sorted_p = probs.gather(-1, order)
    return _keep_mask(
        probs, order, _prefix_reaching(sorted_p, _param_column(params, "typical_p", probs))
    )


FILTERS = {"top_k": _top_k, "top_p": _top_p, "min_p": _min_p, "typical": _typical}


def apply_filters(probs: torch.Tensor, rows: Sequence["SamplingRow"]) -> torch.Tensor:
    """Apply each row's enabled filters in its own order; rows sharing a (stage, filter) go
    together."""
    orders = [r.params.enabled_filters() if r.params.temperature > 0 else () for r in rows]
    for stage in range(max((len(o) for o in orders), default=0)):
        for name, fn in FILTERS.items():
            picked = [i for i, o in enumerate(orders) if len(o) > stage and o[stage] == name]
            if picked:
                index = torch.tensor(picked, device=probs.device)
                probs[index] = fn(probs[index], [rows[i].params for i in picked])
    return probs
