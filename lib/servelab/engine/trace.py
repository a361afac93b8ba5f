"""Per-iteration trace: one plain record per engine step, for notebooks to tabulate and draw.

System boundary: records what the engine decided and measured at each step (times in seconds on the
engine's clock, counts in tokens or blocks as named). It never influences scheduling.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servelab.engine.scheduler import ScheduledChunk, Scheduler, SchedulerOutput
    from servelab.engine.sequence import RequestOutput
    from servelab.kv.allocator import BlockAllocator


@dataclass
class StepRecord:
    """One engine iteration (one scheduler tick plus its forward pass). Maps and lists are keyed by
    sequence id; times are clock readings in seconds; block and queue counts are taken after the
    step."""

    step: int  # iteration number, from 0
    start: float  # clock reading when the step began
    end: float = 0.0  # ... and when it ended
    # prompt (or recompute) tokens computed
    prefill_tokens: dict[str, int] = field(default_factory=dict)
    # decode tokens computed (1, or 1 + drafts)
    decode_tokens: dict[str, int] = field(default_factory=dict)
    # speculative decoding: drafts verified ...
    draft_tokens: dict[str, int] = field(default_factory=dict)
    # ... and accepted, per verify row
    accepted_tokens: dict[str, int] = field(default_factory=dict)
    # (start, end) computed, end exclusive
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)
    # got KV blocks (new, or readmitted after recompute)
    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)  # KV dropped (recompute later)
    swapped_out: list[str] = field(default_factory=list)  # KV moved to host memory
    swapped_in: list[str] = field(default_factory=list)  # KV moved back from host memory
    # running, skipped (token budget spent), KV kept
    descheduled: list[str] = field(default_factory=list)
    # paused by the caller (LLMEngine.pause), skipped; keeps its KV
    paused: list[str] = field(default_factory=list)
    # request id -> finish reason, ended this step
    finished: dict[str, str] = field(default_factory=dict)
    blocks_used: int = 0  # device KV blocks with refcount > 0
    blocks_free: int = 0  # ... with refcount 0
    blocks_shared: int = 0  # ... with refcount > 1 (prefix sharing, forks)
    blocks_cached: int = 0  # free blocks still holding a reusable prefix-cache entry
    num_waiting: int = 0  # queue lengths
    num_running: int = 0
    num_swapped: int = 0

    @property
    def duration(self) -> float:
        """Seconds the step took."""
        return self.end - self.start

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens this step's verify rows emitted per row, ``1 + accepted / rows`` (NaN: none this
        step)."""
        rows = len(self.draft_tokens)
        return 1 + sum(self.accepted_tokens.values()) / rows if rows else float("nan")

    @property
    def num_batched_tokens(self) -> int:
        """Tokens in this step's forward pass."""
        return sum(self.prefill_tokens.values()) + sum(self.decode_tokens.values())

    @classmethod
    def of_step(
        cls,
        step: int,
        start: float,
        end: float,
        sched: "SchedulerOutput",
        outputs: list["RequestOutput"],
        allocator: "BlockAllocator",
        scheduler: "Scheduler",
        accepted: dict[str, int] | None = None,
    ) -> "StepRecord":
        """The record of one step that ran ``sched`` between clock readings ``start`` and ``end``
        and produced ``outputs``, with the engine's pool and queues as the step left them;
        ``accepted``: drafts accepted per sequence id in this step (speculative decoding)."""
        record = cls(step=step, start=start)
        for chunk in sched.chunks:
            record.add_chunk(chunk, len(chunk.seq.prompt_ids))
            if chunk.draft_ids:
                record.draft_tokens[chunk.seq_id] = len(chunk.draft_ids)
                record.accepted_tokens[chunk.seq_id] = (accepted or {}).get(chunk.seq_id, 0)
        finished = {o.request_id: o.finish_reason for o in outputs if o.finished}
        record.close(sched, allocator, scheduler, finished, end)
        return record

    def add_chunk(self, chunk: "ScheduledChunk", prompt_len: int) -> None:
        """Count one scheduled chunk as decode (the newest generated token) or prefill (anything
        that (re)fills the cache), with the positions it computes."""
        decode = (
            chunk.emits_token
            and chunk.num_tokens == 1 + len(chunk.draft_ids)
            and chunk.start >= prompt_len
        )
        counts = self.decode_tokens if decode else self.prefill_tokens
        counts[chunk.seq_id] = chunk.num_tokens
        self.positions[chunk.seq_id] = (chunk.start, chunk.start + chunk.num_tokens)

    def close(self, sched: "SchedulerOutput", allocator: "BlockAllocator", scheduler: "Scheduler",
              finished: dict[str, str], end: float) -> None:
        """Copy the tick's decisions, the pool's and queues' state after the step, and the end
        time."""
        self.admitted, self.preempted = list(sched.admitted), list(sched.preempted)
        self.swapped_out, self.swapped_in = list(sched.swapped_out), list(sched.swapped_in)
        self.descheduled, self.paused = list(sched.descheduled), list(sched.paused)
        self.finished = finished
        self.blocks_used, self.blocks_free = allocator.num_used_blocks, allocator.num_free_blocks
        view = allocator.inspect()
        self.blocks_shared, self.blocks_cached = view.num_shared_blocks, view.num_cached_free_blocks
        self.num_waiting, self.num_running = len(scheduler.waiting), len(scheduler.running)
        self.num_swapped = len(scheduler.swapped)
        self.end = end

    def to_dict(self) -> dict:
        """Plain dict (JSON-ready) with the derived ``duration`` and ``num_batched_tokens``
        added."""
        return {
            **asdict(self),
            "duration": self.duration,
            "num_batched_tokens": self.num_batched_tokens,
        }
