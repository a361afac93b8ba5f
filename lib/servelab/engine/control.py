"""Two drivers that step an engine themselves, through its public API only: :func:`stream` (one
request's text) and :func:`generate` (an offline batch); ``LLMEngine.stream`` / ``LLMEngine.generate``
call them. Also :class:`EngineStats`, what ``LLMEngine.stats`` reports.

System boundary: the engine's API, in engine steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence as SequenceOf
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab.engine.outputs import RequestOutput
from servelab.ledger import LedgerTotals
from servelab.sampling.params import SamplingParams

if TYPE_CHECKING:
    from servelab.engine.engine import LLMEngine


@dataclass(frozen=True)
class EngineStats:
    """The engine's load between two steps: sequences per scheduler queue, and the fraction of KV blocks
    in use (``kv_cache_usage`` in [0, 1]; blocks only in the prefix cache count as free); ``ended``: the
    ledger's exact totals over every request that has ended (:class:`~servelab.ledger.LedgerTotals`)."""

    num_running: int
    num_waiting: int
    num_swapped: int
    kv_cache_usage: float
    ended: LedgerTotals


def stream(engine: "LLMEngine", prompt: str | list[int], params: SamplingParams, **kwargs) -> Iterator[str]:
    """Yield the text deltas of one new request as steps produce them.

    This drives :meth:`LLMEngine.step` itself: other queued requests advance too, but their outputs are not
    returned here (a server with many clients calls :meth:`LLMEngine.step` and routes outputs instead).
    Closing the generator early cancels the request. ``kwargs`` go to :meth:`LLMEngine.add_request`. With
    ``params.n > 1`` the deltas are sample 0's (see :class:`RequestOutput`).
    """
    request_id = engine.add_request(prompt, params, **kwargs)
    finished = False
    try:
        while not finished:
            for output in engine.step():
                if output.request_id == request_id:
                    finished = output.finished
                    if output.delta:
                        yield output.delta
    finally:
        if not finished:  # the reader is gone: cancel, and drop the final output nobody will read
            engine.abort(request_id)

def generate(engine: "LLMEngine", prompts: SequenceOf[str | list[int]] | str,
         params: SamplingParams | SequenceOf[SamplingParams]) -> list[RequestOutput]:
    """Offline batch: run all ``prompts`` to completion; returns each one's final output, in order.

    Like :func:`stream`, it drives :meth:`LLMEngine.step` itself, so outputs of other requests already in the
    engine are consumed and not returned.
    """
    if isinstance(prompts, str):
        prompts = [prompts]
    params_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    if len(params_list) != len(prompts):
        raise ValueError(f"params must be one SamplingParams or one per prompt ({len(prompts)}), "
                         f"got {len(params_list)}")
    ids: list[str] = []
    try:
        for prompt, sp in zip(prompts, params_list):
            ids.append(engine.add_request(prompt, sp))
    except (TypeError, ValueError):  # one bad prompt: withdraw the ones already queued, then report it
        for request_id in ids:
            engine.abort(request_id)
        raise
    final: dict[str, RequestOutput] = {}
    wanted = set(ids)
    while len(final) < len(ids):
        for output in engine.step():
            if output.finished and output.request_id in wanted:  # another request's end is not ours
                final[output.request_id] = output
    return [final[i] for i in ids]
