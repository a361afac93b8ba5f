"""Stop strings in a token stream: what is safe to send to the client, chunk by chunk.

System boundary: this module sits between the detokenizer and the HTTP response of one request. It
receives decoded text pieces (``str`` chunks, one per decode step or coarser) and returns the text
that may be streamed now. It never sees token ids, so a stop string may span any number of chunks.

The rule that makes streaming safe: text that could still turn out to be the beginning of a stop
string is held back until later text rules that out. Once a stop string is complete, it and
everything after it are dropped (OpenAI semantics: the stop string itself is not returned).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopStringBuffer"]


class StopStringBuffer:
    """Holds back streamed text until it can no longer be part of a stop string.

    Feed chunks with :meth:`push`; each call returns the text that is safe to emit now. When a stop
    string completes, the text before it is returned, ``finished`` becomes True, ``finish_reason ==
    "stop"`` and ``matched_stop`` names the string. If several stop strings occur, the one starting
    earliest in the text wins, and at the same start the longest; the buffer waits for more text
    while an earlier (or longer) candidate is still incomplete. At the end of generation call
    :meth:`flush` to release what is still held. With no stop strings every chunk passes through
    unchanged.
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        if isinstance(stop_strings, str) or not isinstance(stop_strings, Sequence):
            raise TypeError(
                "stop_strings must be a sequence of strings (wrap a single one in a list)"
            )
        for stop in stop_strings:
            if not isinstance(stop, str):
                raise TypeError(f"stop_strings must contain str, got {type(stop).__name__}")
            if not stop:
                raise ValueError("stop_strings must not contain the empty string")
        self._stops: tuple[str, ...] = tuple(stop_strings)
        self._pending = ""
        self._closed = False
        self.matched_stop: str | None = None

    @property
    def finished(self) -> bool:
        """True once a stop string matched or :meth:`flush` was called; no more text is accepted."""
        return self._closed

    @property
    def finish_reason(self) -> str | None:
        """``"stop"`` after a stop string matched, otherwise None."""
        return "stop" if self.matched_stop is not None else None

    @property
    def held(self) -> str:
        """The text currently held back (a possible start of a stop string)."""
        return self._pending

    def push(self, chunk: str) -> str:
        """Append one decoded chunk and return the text that is now safe to emit (possibly "")."""
        if not isinstance(chunk, str):
            raise TypeError(f"chunk must be a str, got {type(chunk).__name__}")
        if self._closed:
            raise RuntimeError(
                "push after the stream finished (a stop string matched or flush ran)"
            )
        self._pending += chunk
        return self._release(final=False)

    def flush(self) -> str:
        """End of generation: return everything still held (text before a stop string, if one is
        complete in the held text). Further pushes raise; flushing again returns ""."""
        released = "" if self._closed else self._release(final=True)
        self._closed = True
        return released

    def _earliest_match(self) -> tuple[int, str] | None:
        """The complete stop string starting earliest in the pending text (longest on a tie)."""
        found = [(self._pending.find(stop), stop) for stop in self._stops]
        found = [(start, stop) for start, stop in found if start >= 0]
        if not found:
            return None
        return min(found, key=lambda match: (match[0], -len(match[1])))

    def _partial_start(self) -> int:
        """Start of the longest pending suffix that is a proper prefix of some stop string."""
        text = self._pending
        longest = max((len(stop) for stop in self._stops), default=0)
        for start in range(max(0, len(text) - longest + 1), len(text)):
            tail = text[start:]
            if any(len(stop) > len(tail) and stop.startswith(tail) for stop in self._stops):
                return start
        return len(text)

    def _release(self, final: bool) -> str:
        match = self._earliest_match()
        hold_from = len(self._pending) if final else self._partial_start()
        if match is not None and match[0] < hold_from:
            start, stop = match
            released = self._pending[:start]
            self._pending = ""
            self.matched_stop = stop
            self._closed = True
            return released
        released, self._pending = self._pending[:hold_from], self._pending[hold_from:]
        return released
