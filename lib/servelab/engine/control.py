"""What a caller can do with requests besides adding them and stepping: ask for the engine's load
(:meth:`~RequestControls.stats`), cancel, pause and resume a request in flight, and two drivers that
step the engine themselves (:meth:`~RequestControls.stream` for one
request's text, :meth:`~RequestControls.generate` for an offline batch).

:class:`RequestControls` is mixed into :class:`~servelab.engine.engine.LLMEngine`; every ending still goes
through the engine's one terminal path (``_end``). System boundary: the engine's API, in engine steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence as SequenceOf
from dataclasses import dataclass

from servelab.engine.outputs import RequestOutput
from servelab.sampling import SamplingParams


@dataclass(frozen=True)
class EngineStats:
    """The engine's load between two steps: sequences per scheduler queue, and the fraction of KV blocks
    in use (``kv_cache_usage`` in [0, 1]; blocks only in the prefix cache count as free)."""

    num_running: int
    num_waiting: int
    num_swapped: int
    kv_cache_usage: float


class RequestControls:
    """Cancel / pause / resume and the ``stream`` / ``generate`` drivers of ``LLMEngine``.

    They use the engine's ``scheduler`` and ``allocator`` (for :meth:`stats`), ``add_request``, ``step``, ``clock``, ``_live`` (the request if it has not
    ended), ``_end`` (the terminal path) and ``_pending`` (final outputs the next step returns).
    """

    _pending: list[RequestOutput]

    def stats(self) -> EngineStats:
        """Sequences running, waiting and swapped out now, and the KV pool's used fraction (what the
        server's ``/metrics`` and its queue limit read: public questions, not the scheduler's lists)."""
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting), len(self.scheduler.swapped),
                           self.allocator.num_used_blocks / self.allocator.num_blocks)

    def cancel(self, request_id: str) -> bool:
        """Cancel a request; its final output (``finish_reason="cancelled"``) comes from the next step.

        Returns False when it had already ended. Raises KeyError for an id this engine never issued.
        """
        request = self._live(request_id)
        if request is None:
            return False
        self._pending.append(self._end(request, "cancelled"))
        return True

    def pause(self, request_id: str) -> bool:
        """Deschedule a request until :meth:`resume`: no step computes or samples it meanwhile.

        It keeps everything it holds: a running request its KV blocks (and any reservation) and its
        batch slot, so this frees compute, not memory (KV pressure can still preempt it by recompute or
        swap). A waiting request is not admitted, a swapped one not swapped in. A request in decode
        is in BACKPRESSURED (the lifecycle's paused-with-KV state) while paused; in other stages its
        lifecycle state stays. Its deadline still runs and :meth:`cancel` still works, both through the one reclaim path.
        Pausing a paused request changes nothing. Returns False when it had already ended; KeyError for
        an unknown id.
        """
        return self._set_paused(request_id, True)

    def resume(self, request_id: str) -> bool:
        """Undo :meth:`pause`: the next step schedules the request again, from exactly where it stopped.

        BACKPRESSURED goes back to DECODE. Resuming a request that is not paused changes nothing.
        Returns False when it had already ended; KeyError for an unknown id.
        """
        return self._set_paused(request_id, False)

    def _set_paused(self, request_id: str, paused: bool) -> bool:
        """Flag every sample of a live request (its lifecycle state, DECODE <-> BACKPRESSURED, follows)."""
        request = self._live(request_id)
        if request is None:
            return False
        for seq in request.seqs:
            seq.paused = paused
        return True

    def stream(self, prompt: str | list[int], params: SamplingParams, **kwargs) -> Iterator[str]:
        """Yield the text deltas of one new request as steps produce them.

        This drives :meth:`step` itself: other queued requests advance too, but their outputs are not
        returned here (a server with many clients calls :meth:`step` and routes outputs instead).
        Closing the generator early cancels the request. ``kwargs`` go to :meth:`add_request`. With
        ``params.n > 1`` the deltas are sample 0's (see :class:`RequestOutput`).
        """
        request_id = self.add_request(prompt, params, **kwargs)
        finished = False
        try:
            while not finished:
                for output in self.step():
                    if output.request_id == request_id:
                        finished = output.finished
                        if output.delta:
                            yield output.delta
        finally:
            if not finished:  # the reader is gone: cancel, and drop the final output nobody will read
                self.cancel(request_id)
                self._pending = [o for o in self._pending if o.request_id != request_id]

    def generate(self, prompts: SequenceOf[str | list[int]] | str,
                 params: SamplingParams | SequenceOf[SamplingParams]) -> list[RequestOutput]:
        """Offline batch: run all ``prompts`` to completion; returns each one's final output, in order.

        Like :meth:`stream`, it drives :meth:`step` itself, so outputs of other requests already in the
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
                ids.append(self.add_request(prompt, sp))
        except (TypeError, ValueError):  # one bad prompt: withdraw the ones already queued, then report it
            for request_id in ids:
                self.cancel(request_id)
            self._pending = [o for o in self._pending if o.request_id not in ids]
            raise
        final: dict[str, RequestOutput] = {}
        wanted = set(ids)
        while len(final) < len(ids):
            for output in self.step():
                if output.finished and output.request_id in wanted:  # another request's end is not ours
                    final[output.request_id] = output
        return [final[i] for i in ids]

