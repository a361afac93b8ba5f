"""What a queue policy reads from a waiting request: the :class:`Queued` protocol, and the key type.

The ``EngineSequence`` and the tick simulators' requests both provide these fields, so one set
of policies (:mod:`servelab.scheduling.queue_policy`, :mod:`servelab.scheduling.queue_disciplines`)
orders both. System boundary: a type only; nothing here orders anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["Key", "Queued"]


class Queued(Protocol):
    """What every policy reads from a waiting request."""

    @property
    def arrival_index(self) -> int:
        """Place in arrival order (distinct per request: the tie-breaker that makes orders
        total)."""

    @property
    def priority(self) -> int:
        """Priority class: lower is served first."""

    @property
    def remaining_tokens(self) -> int:
        """Tokens it may still generate: a proxy for (or an oracle of) its remaining work."""


Key = Callable[[Queued], tuple]
