""":class:`LLMEngine`: the engine a caller drives between steps (load, add, state, stats, cancel,
pause / resume, abort) over :class:`~servelab.engine.engine.EngineCore`, which owns the state and
the step; and the two drivers that step an engine through that API: :func:`stream` (one request's
text) and :func:`generate` (an offline batch).

None of it runs inside ``EngineCore.step``, which reads the requests these methods queue and flag.
System boundary: the engine's API; times are the injected clock's seconds.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from servelab.model.chat_template import ChatTemplate
from servelab.device import resolve_device_dtype
from servelab.engine.config import EngineConfig
from servelab.engine.engine import EngineCore
from servelab.engine.kv_pool_size import PoolSize
from servelab.engine.request import lifecycle_state, new_request
from servelab.engine.scheduler import PreemptionStats
from servelab.engine.sequence import EngineRequest, RequestOutput
from servelab.engine.spec_verify import SpecDecodingStats
from servelab.lifecycle.ledger import LedgerTotals
from servelab.lifecycle.state_machine import RequestState
from servelab.sampling.params import SamplingParams


@dataclass(frozen=True)
class EngineStats:
    """The engine's load between two steps: sequences per scheduler queue, and the fraction of KV
    blocks in use (``kv_cache_usage`` in [0, 1]; blocks only in the prefix cache count as free);
    ``ended``: the ledger's exact totals over every request that has ended
    (:class:`~servelab.lifecycle.ledger.LedgerTotals`);
    ``spec_decoding``: speculative decoding's counters so far, vLLM's names (None: speculation off);
    ``preemption``: preemption by recompute so far, and the prefix-cache hits of the readmissions
    (:class:`~servelab.engine.scheduler.PreemptionStats`, vLLM's ``preempted_*`` names)."""

    num_running: int
    num_waiting: int
    num_swapped: int
    kv_cache_usage: float
    ended: LedgerTotals
    spec_decoding: SpecDecodingStats | None = None
    preemption: PreemptionStats = field(default_factory=PreemptionStats)


class LLMEngine(EngineCore):
    """The engine as a caller uses it: what it does between steps. The state read here is
    :class:`~servelab.engine.engine.EngineCore`'s, set in its ``__init__``."""

    # the checkpoint's, set by from_pretrained; None: it has none
    chat_template: ChatTemplate | None = None
    # generation_config.json's temperature / top_p / top_k / min_p / repetition_penalty, set by
    # from_pretrained
    default_sampling: Mapping[str, float | int] = MappingProxyType({})

    @classmethod
    def from_pretrained(cls, path_or_id: str | Path | None = None, *, allow_download: bool = False,
                        device: str | None = None, dtype: str | None = None,
                        clock: Callable[[], float] = time.perf_counter, **config) -> LLMEngine:
        """An engine over a Llama checkpoint folder (default: the shipped Shakespeare model) with
        its tokenizer, chat template (:attr:`chat_template`) and default sampling settings
        (:attr:`default_sampling`, from ``generation_config.json``: see :meth:`sampling_params`), or
        over a Hugging Face Hub id such as ``"HuggingFaceTB/SmolLM2-135M-Instruct"`` when
        ``allow_download=True`` (never by default).

        ``device`` / ``dtype`` default to :func:`servelab.device.pick_device`; other keyword
        arguments are :class:`EngineConfig` fields. See :mod:`servelab.model.pretrained`.
        """
        from servelab.model.pretrained import load_pretrained

        engine_config = EngineConfig(device=device, dtype=dtype, **config)
        where, precision = resolve_device_dtype(engine_config)
        model, tokenizer, template, defaults = load_pretrained(
            path_or_id, allow_download=allow_download, device=where, dtype=precision
        )
        engine = cls(model, tokenizer, engine_config, clock=clock)
        engine.chat_template = template
        engine.default_sampling = MappingProxyType(defaults)
        return engine

    @property
    def kv_pool(self) -> PoolSize:
        """The KV pool this engine got (:mod:`servelab.engine.kv_pool_size`): ``num_blocks``,
        ``tokens``, ``bytes`` and ``max_concurrency(tokens_per_request)``; ``describe()`` is the
        line logged at start."""
        return self.runner.pool_size

    def sampling_params(self, **fields) -> SamplingParams:
        """:class:`SamplingParams` of ``fields`` over the checkpoint's :attr:`default_sampling`: a
        field given here keeps its value, one left out takes ``generation_config.json``'s, else the
        course default (:mod:`servelab.model.generation_config` lists the fields read)."""
        return SamplingParams(**(dict(self.default_sampling) | fields))

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        deadline_s: float | None = None,
        namespace: str = "",
        priority: int = 0,
        tenant: str | None = None,
    ) -> str:
        """Queue a request; returns its id.

        ``prompt`` is text or token ids. ``deadline_s`` (seconds after arrival) ends it as
        ``timed_out`` if it has not finished by then. ``namespace`` salts the prefix cache (tenants
        never share KV across namespaces). ``priority`` orders the queue under the ``"priority"``
        policy (lower first). ``tenant`` names who sent it for the ``"fair-queuing"`` policy (None:
        the ``namespace``).
        Checks: :class:`~servelab.engine.validation.RequestValidator`.
        """
        arrival = self.clock()
        prompt_ids = self.validator.prompt_ids(prompt)
        self.validator.check_params(params, prompt_ids)
        request_id = self.validator.request_id(request_id, self._id_in_use)
        tenant = namespace if tenant is None else tenant
        self.validator.check_options(deadline_s, namespace, priority, tenant)
        # a namespace of its own: no prefix hit skips a scored position
        if params.prompt_logprobs is not None:
            namespace = f"{namespace}\x00prompt-logprobs:{request_id}"
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(63)
        arrival_index = next(self._arrivals)
        request = new_request(
            request_id,
            self.validator.sample_ids(request_id, params.n, self._id_in_use),
            prompt_ids,
            params,
            tokenizer=self.tokenizer,
            arrival=arrival,
            arrival_index=arrival_index,
            seed=seed,
            namespace=namespace,
            priority=priority,
            tenant=tenant,
            deadline=None if deadline_s is None else arrival + deadline_s,
        )
        self._requests[request_id] = request
        self.scheduler.add(request.seq)  # the siblings join when it forks, after its prompt
        return request_id

    def state(self, request_id: str) -> RequestState:
        """The request's lifecycle state now (``servelab.lifecycle.state_machine.RequestState``):
        read off the scheduler's state of its sequences while it runs, its terminal record's once it
        has ended. KeyError for an id this engine does not know: never issued, or ended more than
        ``config.ledger_size`` requests ago (its record left the ledger's window)."""
        request = self._requests.get(request_id)
        if request is not None:
            return lifecycle_state(request)
        return self.ledger.get(request_id).state

    def has_unfinished(self) -> bool:
        """True while some request has not ended (or an ended one's final output is not yet
        returned)."""
        return bool(self._requests or self._pending)

    def stats(self) -> EngineStats:
        """Sequences running, waiting and swapped out now, the KV pool's used fraction (what the
        server's ``/metrics`` and its queue limit read: public questions, not the scheduler's
        lists), and the exact totals of every ended request (the ledger's, not its bounded
        window)."""
        return EngineStats(
            len(self.scheduler.running),
            len(self.scheduler.waiting),
            len(self.scheduler.swapped),
            self.allocator.num_used_blocks / self.allocator.num_blocks,
            self.ledger.totals(),
            None if self.spec_stats is None else copy.deepcopy(self.spec_stats),
            copy.copy(self.scheduler.preemption),
        )

    def cancel(self, request_id: str) -> bool:
        """Cancel a request; its final output (``finish_reason="cancelled"``) comes from the next
        step.

        Returns False when it had already ended. Raises KeyError for an id this engine does not know
        (never issued, or its record left the ledger's window).
        """
        request = self._live(request_id)
        if request is None:
            return False
        self._pending.append(self._end(request, "cancelled"))
        return True

    def pause(self, request_id: str) -> bool:
        """Deschedule a request until :meth:`resume`: no step computes or samples it meanwhile.

        It keeps everything it holds: a running request its KV blocks (and any reservation) and its
        batch slot, so this frees compute, not memory (KV pressure can still preempt it by recompute
        or swap). A waiting request is not admitted, a swapped one not swapped in. A request in
        decode is in BACKPRESSURED (the lifecycle's paused-with-KV state) while paused; in other
        stages its lifecycle state stays. Its deadline still runs and :meth:`cancel` still works,
        both through the one reclaim path. Pausing a paused request changes nothing. Returns False
        when it had already ended; KeyError for an unknown id.
        """
        return self._set_paused(request_id, True)

    def resume(self, request_id: str) -> bool:
        """Undo :meth:`pause`: the next step schedules the request again, from exactly where it
        stopped.

        BACKPRESSURED goes back to DECODE. Resuming a request that is not paused changes nothing.
        Returns False when it had already ended; KeyError for an unknown id.
        """
        return self._set_paused(request_id, False)

    def abort(self, request_id: str) -> bool:
        """:meth:`cancel` whose final output is dropped instead of returned (the caller is gone)."""
        if not self.cancel(request_id):
            return False
        self._pending = [o for o in self._pending if o.request_id != request_id]
        return True

    def stream(self, prompt: str | list[int], params: SamplingParams, **kwargs) -> Iterator[str]:
        """Yield the text deltas of one new request as steps produce them (see :func:`stream`)."""
        return stream(self, prompt, params, **kwargs)

    def generate(self, prompts: Sequence[str | list[int]] | str,
                 params: SamplingParams | Sequence[SamplingParams]) -> list[RequestOutput]:
        """Offline batch: run all ``prompts`` to completion; each one's final output, in order
        (see :func:`generate`)."""
        return generate(self, prompts, params)

    def _set_paused(self, request_id: str, paused: bool) -> bool:
        """Flag every sample of a live request (its lifecycle state, DECODE <-> BACKPRESSURED,
        follows)."""
        request = self._live(request_id)
        if request is None:
            return False
        for seq in request.seqs:
            seq.paused = paused
        return True

    def _live(self, request_id: str) -> EngineRequest | None:
        """The request if it has not ended; None if it has (within the ledger's window); KeyError
        otherwise."""
        request = self._requests.get(request_id)
        if request is None and not self.ledger.has(request_id):
            raise KeyError(f"request_id {request_id!r} is unknown to this engine")
        return request

    def _id_in_use(self, seq_or_request_id: str) -> bool:
        """True for a live request's id, an ended one's still in the ledger's window (the last
        ``config.ledger_size``), and the sample sequence ids of a live request."""
        if seq_or_request_id in self._requests or self.ledger.has(seq_or_request_id):
            return True
        request = self._requests.get(seq_or_request_id.rpartition("/")[0])
        return request is not None and any(s.seq_id == seq_or_request_id for s in request.seqs)


def stream(
    engine: LLMEngine, prompt: str | list[int], params: SamplingParams, **kwargs
) -> Iterator[str]:
    """Yield the text deltas of one new request as steps produce them.

    This drives :meth:`LLMEngine.step` itself: other queued requests advance too, but their outputs
    are not returned here (a server with many clients calls :meth:`LLMEngine.step` and routes
    outputs instead). Closing the generator early cancels the request. ``kwargs`` go to
    :meth:`LLMEngine.add_request`. With ``params.n > 1`` the deltas are sample 0's (see
    :class:`RequestOutput`).
    """
    request_id = engine.add_request(prompt, params, **kwargs)
    finished = False
    try:
        while not finished:
            for output in engine.step().outputs:
                if output.request_id == request_id:
                    finished = output.finished
                    if output.delta:
                        yield output.delta
    finally:
        if not finished:  # the reader is gone: cancel, and drop the final output nobody will read
            engine.abort(request_id)


def generate(engine: LLMEngine, prompts: Sequence[str | list[int]] | str,
         params: SamplingParams | Sequence[SamplingParams]) -> list[RequestOutput]:
    """Offline batch: run all ``prompts`` to completion; returns each one's final output, in order.

    Like :func:`stream`, it drives :meth:`LLMEngine.step` itself, so outputs of other requests
    already in the engine are consumed and not returned.
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
    # one bad prompt: withdraw the ones already queued, then report it
    except (TypeError, ValueError):
        for request_id in ids:
            engine.abort(request_id)
        raise
    final: dict[str, RequestOutput] = {}
    wanted = set(ids)
    while len(final) < len(ids):
        for output in engine.step().outputs:
            if output.finished and output.request_id in wanted:  # another request's end is not ours
                final[output.request_id] = output
    return [final[i] for i in ids]
