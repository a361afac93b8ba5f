"""One sample of a request inside the engine: its tokens, KV progress, text and timestamps, in one record.

A request with ``n`` samples has ``n`` sequences (``Sequence.request`` points back to it); the scheduler,
the model runner and output processing all read and write the same record. Vocabulary (counts in tokens):

* ``token_ids`` = prompt ids + generated ids so far;
* ``num_computed`` = leading tokens whose K/V are in the cache (committed KV). A sequence in decode has
  ``num_computed == num_tokens - 1``: the newest sampled token still has to run through the model;
* ``cached_prompt_tokens`` = prompt tokens that a prefix-cache hit supplied at first admission;
* ``emitted_ids`` = generated ids whose text has reached the caller (a stop-string prefix waits).

System boundary: plain bookkeeping, no tensors. The scheduler moves sequences between its queues, the
engine appends sampled tokens and turns them into text (:mod:`servelab.engine.outputs`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from servelab.sampling.params import SamplingParams
from servelab.streaming import StopStringBuffer

if TYPE_CHECKING:
    from servelab.engine.request import EngineRequest
    from servelab.engine.sampler import TokenLogprob


class SeqStatus(enum.Enum):
    """Where the scheduler holds a sequence."""

    WAITING = "waiting"  # queued for (re)admission; holds no KV blocks
    RUNNING = "running"  # holds KV blocks in the device pool
    SWAPPED = "swapped"  # its KV lives in host memory; holds no device blocks
    FINISHED = "finished"  # reclaimed; holds nothing


@dataclass
class SequenceTimes:
    """Timestamps in seconds from the engine's clock (one boundary: the engine's API)."""

    arrival: float
    first_scheduled: float | None = None
    emits: list[float] = field(default_factory=list)  # one per token id handed to the client
    finish: float | None = None


@dataclass(eq=False)
class Sequence:
    """One sample of a request: what the scheduler, the model runner and output processing share."""

    seq_id: str
    request: "EngineRequest"
    index: int  # which of the request's n samples (sample i is seeded with seed + i)
    prompt_ids: list[int]
    params: SamplingParams
    arrival_index: int  # tie-breaker that makes queue order total and deterministic
    times: SequenceTimes
    generator: torch.Generator
    detok: "IncrementalDetokenizer"
    stops: StopStringBuffer
    namespace: str = ""
    priority: int = 0
    deadline: float | None = None  # absolute time on the engine's clock
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    cached_prompt_tokens: int | None = None  # set at first admission
    status: SeqStatus = SeqStatus.WAITING
    paused: bool = False  # descheduled by the caller: every tick skips it; it keeps whatever it holds
    # sibling sequences it forks into once its prompt is computed (n - 1 for a request with n samples,
    # 0 after the fork); it holds a batch slot for each of them in advance
    samples_to_fork: int = 0
    # the text side: what the caller has been sent and what waits
    text: str = ""
    token_ends: list[int] = field(default_factory=list)  # decoded text length after each generated token
    emitted_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    committed_at_end: int = 0  # num_computed when it finished (what it held just before release)
    delta: str = ""  # text produced since the last output, not yet handed out
    delta_ids: tuple[int, ...] = ()  # ids released since the last output
    # logprobs (params.logprobs / params.prompt_logprobs) and the structured-output grammar's state
    logprobs: list["TokenLogprob"] = field(default_factory=list)  # one per generated token
    logprobs_sent: int = 0
    prompt_logprobs: list["TokenLogprob"] = field(default_factory=list)  # prompt token i + 1 at index i
    prompt_logprobs_sent: bool = False
    matcher: object | None = None  # the sample's xgrammar matcher (params.grammar), made at its first step

    @property
    def token_ids(self) -> list[int]:
        """Prompt ids followed by the generated ids."""
        return self.prompt_ids + self.output_ids

    def tokens_between(self, start: int, end: int) -> list[int]:
        """``token_ids[start:end]`` without building the whole list (a decode step reads one token)."""
        split = len(self.prompt_ids)
        if start >= split:
            return self.output_ids[start - split:end - split]
        if end <= split:
            return self.prompt_ids[start:end]
        return self.prompt_ids[start:] + self.output_ids[:end - split]

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        """Tokens still to run through the model before the next sample (1 in steady decode)."""
        return self.num_tokens - self.num_computed

    @property
    def batch_slots(self) -> int:
        """Batch slots it takes while running: its own plus one per sibling it will still fork into."""
        return 1 + self.samples_to_fork

    @property
    def remaining_tokens(self) -> int:
        """Tokens it may still generate under ``max_tokens``."""
        return self.params.max_tokens - len(self.output_ids)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, decoding only a short window each time.

    A byte-level tokenizer may split one UTF-8 character over several tokens; until the rest arrives the
    decoded text ends in U+FFFD, so that tail is held back rather than sent and then contradicted. The
    window starts at the last token whose text was already returned (``_prefix``): decoding
    ``ids[_prefix:]`` and dropping the text of ``ids[_prefix:_read]`` gives exactly the new text, at a
    cost independent of the output length.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.text = ""  # all text returned so far
        self._prefix = 0  # window start: context for the tokens not yet returned
        self._read = 0  # ids before this index have had their text returned

    def update(self, token_ids: list[int], final: bool = False) -> str:
        """New text for ``token_ids`` (all generated ids so far); ``final`` releases a held tail."""
        seen = self.tokenizer.decode(token_ids[self._prefix:self._read])
        window = self.tokenizer.decode(token_ids[self._prefix:])
        if (window.endswith("\ufffd") and not final) or len(window) <= len(seen):
            return ""
        delta = window[len(seen):]
        self._prefix, self._read = self._read, len(token_ids)
        self.text += delta
        return delta
