"""The terminal records of requests: one ``Usage`` (token counts) and one ``TerminalRecord`` per
request, kept in a bounded, thread-safe ``Ledger``.

``servelab.lifecycle.state_machine.reclaim`` (the §0 model) and ``LLMEngine`` (which writes one
record per request as it releases it) both append here. System boundary: bookkeeping only; times are
seconds on the caller's clock, counts are tokens or blocks as named.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

from servelab._validate import require_int
from servelab.lifecycle.states import RequestState

__all__ = ["Usage", "TerminalRecord", "LedgerTotals", "Ledger"]


# summed
_USAGE_FIELDS = ("prompt_tokens", "generated_tokens", "emitted_tokens", "cached_prompt_tokens")


@dataclass(frozen=True)
class Usage:
    """Token counts of one request (tokens): the billing record, and the engine's per-output totals.

    ``generated_tokens`` were sampled; ``emitted_tokens`` reached the client. They differ when text
    after a stop string is discarded or a stream is cut (an EOS token, tokens inside or after a
    matched stop string, text held back when a request is cancelled), so a record states both.
    ``cached_prompt_tokens``: prompt tokens a prefix-cache hit supplied. ``committed_tokens``:
    tokens whose KV the cache holds for the request (prompt + generated - 1 in steady decode; 0
    after a preemption by recompute until it is prefilled again; at the end, what it held just
    before release).
    """

    prompt_tokens: int = 0
    generated_tokens: int = 0
    emitted_tokens: int = 0
    cached_prompt_tokens: int = 0
    committed_tokens: int = 0

    def __post_init__(self) -> None:
        for name in (*_USAGE_FIELDS, "committed_tokens"):
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


_SUMMED = ("blocks_freed", "reservation_released", "slots_released", "swap_released")


@dataclass(frozen=True)
class LedgerTotals:
    """Exact totals over every terminal record a :class:`Ledger` was given, kept or dropped.

    ``requests``: records appended; ``by_state``: of those, per terminal state. The token fields sum
    each record's ``Usage`` (tokens); ``blocks_freed``, ``reservation_released`` and
    ``swap_released`` (blocks) and ``slots_released`` (batch slots) sum what the cleanups released.
    """

    requests: int
    by_state: dict[RequestState, int]
    prompt_tokens: int
    generated_tokens: int
    emitted_tokens: int
    cached_prompt_tokens: int
    blocks_freed: int
    reservation_released: int
    slots_released: int
    swap_released: int


class Ledger:
    """Thread-safe ledger of terminal records with bounded memory: a window of the most recent
    ``max_records`` records (a ``deque``) for inspection, and exact running totals (:meth:`totals`)
    over every record ever appended.

    Duplicate-id guarantee: :meth:`append` refuses a record whose ``request_id`` already has one
    among the kept (last ``max_records``) records. An id whose record has left the window is
    forgotten: it may be appended again, and :meth:`has` / :meth:`get` no longer know it.
    (``LLMEngine`` refuses a new request whose id is live or in this window; ``max_records=0`` keeps
    no record and checks nothing.) Memory is O(``max_records``), whatever the number of requests.
    """

    def __init__(self, max_records: int = 10_000) -> None:
        require_int("max_records", max_records, 0)
        self._records: deque[TerminalRecord] = deque(maxlen=max_records)
        self._by_id: dict[Hashable, TerminalRecord] = {}  # the kept records, by id
        self._counts: Counter[RequestState] = Counter()
        self._sums: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def max_records(self) -> int:
        """The window: most records kept."""
        return self._records.maxlen

    def append(self, record: TerminalRecord) -> None:
        """Add ``record`` to the totals and the window; ValueError if its request has a kept
        record."""
        if not isinstance(record, TerminalRecord):
            raise TypeError(f"record must be a TerminalRecord, got {type(record).__name__}")
        with self._lock:
            if record.request_id in self._by_id:
                raise ValueError(f"request_id {record.request_id!r} already has a terminal record")
            self._count(record)
            if self.max_records == 0:
                return
            if len(self._records) == self.max_records:
                del self._by_id[self._records.popleft().request_id]
            self._records.append(record)
            self._by_id[record.request_id] = record

    def _count(self, record: TerminalRecord) -> None:
        self._counts[record.state] += 1
        self._sums["requests"] += 1
        for name in _USAGE_FIELDS:
            self._sums[name] += getattr(record.usage, name)
        for name in _SUMMED:
            self._sums[name] += getattr(record, name)

    def has(self, request_id: Hashable) -> bool:
        """True when ``request_id`` has a record in the window (see the duplicate-id guarantee)."""
        return request_id in self._by_id

    def get(self, request_id: Hashable) -> TerminalRecord:
        """The kept terminal record of ``request_id``; KeyError naming it when there is none."""
        try:
            return self._by_id[request_id]
        except KeyError:
            raise KeyError(f"request_id {request_id!r} has no kept terminal record") from None

    def totals(self) -> LedgerTotals:
        """Exact totals over every record appended so far (kept or not)."""
        with self._lock:
            sums = {name: self._sums[name] for name in ("requests", *_USAGE_FIELDS, *_SUMMED)}
            return LedgerTotals(by_state=dict(self._counts), **sums)

    @property
    def records(self) -> tuple[TerminalRecord, ...]:
        """The kept records, in the order the requests ended."""
        with self._lock:
            return tuple(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[TerminalRecord]:
        return iter(self.records)
