"""The terminal records of requests: one ``Usage`` (token counts) and one ``TerminalRecord`` per request,
kept in a bounded, thread-safe ``Ledger``.

``servelab.lifecycle.reclaim`` (the §0 model) and ``LLMEngine`` (which writes one record per request as
it releases it) both append here. System boundary: bookkeeping only; times are seconds on the caller's
clock, counts are tokens or blocks as named.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab._validate import require_int

if TYPE_CHECKING:
    from servelab.lifecycle import RequestState

__all__ = ["Usage", "TerminalRecord", "Ledger"]


@dataclass(frozen=True)
class Usage:
    """Token counts of one request (tokens): the billing record, and the engine's per-output totals.

    ``generated_tokens`` were sampled; ``emitted_tokens`` reached the client. They differ when text
    after a stop string is discarded or a stream is cut (an EOS token, tokens inside or after a matched
    stop string, text held back when a request is cancelled), so a record states both.
    ``cached_prompt_tokens``: prompt tokens a prefix-cache hit supplied. ``committed_tokens``: tokens
    whose KV the cache holds for the request (prompt + generated - 1 in steady decode; 0 after a
    preemption by recompute until it is prefilled again; at the end, what it held just before release).
    """

    prompt_tokens: int = 0
    generated_tokens: int = 0
    emitted_tokens: int = 0
    cached_prompt_tokens: int = 0
    committed_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "generated_tokens", "emitted_tokens", "cached_prompt_tokens",
                     "committed_tokens"):
            require_int(name, getattr(self, name), 0)
        if self.emitted_tokens > self.generated_tokens:
            raise ValueError(
                f"emitted_tokens must be in [0, generated_tokens={self.generated_tokens}], "
                f"got {self.emitted_tokens}"
            )


@dataclass(frozen=True)
class TerminalRecord:
    """The one billing/log record a request gets when it ends, with what its cleanup released."""

    request_id: Hashable
    state: RequestState
    reason: str
    at: float
    usage: Usage
    from_state: RequestState
    blocks_freed: int
    reservation_released: int
    slots_released: int
    swap_released: int


class Ledger:
    """Thread-safe ledger of terminal records: at most one per request id.

    ``max_records`` bounds what is kept (the most recent records; None keeps all), so a long-running
    engine's memory stays flat. The ids that already have a record and the counts per terminal state
    are kept for every request, so the duplicate-id check and ``counts`` never forget.
    """

    def __init__(self, max_records: int | None = None) -> None:
        if max_records is not None:
            require_int("max_records", max_records, 0)
        self._records: deque[TerminalRecord] = deque(maxlen=max_records)
        self._by_id: dict[Hashable, TerminalRecord] = {}  # the kept records, by id
        self._ids: set[Hashable] = set()
        self._counts: Counter[RequestState] = Counter()
        self._lock = threading.Lock()

    def append(self, record: TerminalRecord) -> None:
        """Add ``record``; ValueError if its request already has a record."""
        if not isinstance(record, TerminalRecord):
            raise TypeError(f"record must be a TerminalRecord, got {type(record).__name__}")
        with self._lock:
            if record.request_id in self._ids:
                raise ValueError(f"request_id {record.request_id!r} already has a terminal record")
            if self._records.maxlen is not None and len(self._records) == self._records.maxlen and self._records:
                del self._by_id[self._records[0].request_id]
            self._ids.add(record.request_id)
            self._counts[record.state] += 1
            if self._records.maxlen != 0:
                self._records.append(record)
                self._by_id[record.request_id] = record

    def has(self, request_id: Hashable) -> bool:
        """True when ``request_id`` already has its terminal record (kept or not)."""
        return request_id in self._ids

    def get(self, request_id: Hashable) -> TerminalRecord:
        """The kept terminal record of ``request_id``; KeyError naming it when there is none."""
        try:
            return self._by_id[request_id]
        except KeyError:
            raise KeyError(f"request_id {request_id!r} has no kept terminal record") from None

    @property
    def counts(self) -> dict[RequestState, int]:
        """Requests ended so far per terminal state (every request, kept or not)."""
        return dict(self._counts)

    @property
    def records(self) -> tuple[TerminalRecord, ...]:
        """The kept records, in the order the requests ended."""
        return tuple(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[TerminalRecord]:
        return iter(self.records)
