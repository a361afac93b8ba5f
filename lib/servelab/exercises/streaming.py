"""Checker for the stop-string buffer exercise.

Student interface (a class)::

    class StopBuffer:
        def __init__(self, stop_strings: list[str]) -> None: ...
        def push(self, chunk: str) -> str: ...   # text safe to send now (possibly "")
        def flush(self) -> str: ...              # end of generation: release what is still held

When a stop string completes, ``push`` returns the text before it and the stream ends (the stop
string and anything after it are never sent). The reference is
``servelab.sampling.stop_strings.StopStringBuffer``; each case feeds the same chunks to both and
compares what comes out after every push.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence

from servelab.exercises.hidden import hidden_rng
from servelab.exercises.result import Case, CaseFailure, CheckResult, run_cases
from servelab.sampling.stop_strings import StopStringBuffer

__all__ = ["check_stop_buffer"]

STOP_CASES = (
    ("a stop string split over three chunks is never sent", ["###"], ["ok #", "#", "# more"]),
    ("stop string split inside a tag", ["</s>"], ["Hello", " wor", "ld<", "/", "s>tail"]),
    ("false alarm is released later", ["</s>"], ["a <", "b> c"]),
    ("no match: flush recovers all text", ["STOP"], ["no", " stop", " S", "TO"]),
    ("stop string inside one chunk", ["END"], ["abcENDdef"]),
    ("one of two stop strings matches", ["\n\n", "Q:"], ["answer\n", "Q: next"]),
    ("no stop strings: pass-through", [], ["a", "b", "c"]),
)


def hidden_cases(seed: int) -> tuple:
    """The public rules with every letter renamed by one seeded bijection (``</s>`` may become
    ``</q>``).

    A renaming keeps every overlap between the text and the stop strings, so each rule still holds.
    """
    rng = hidden_rng(seed, "stop_buffer")
    lower, upper = list(string.ascii_lowercase), list(string.ascii_uppercase)
    rng.shuffle(lower)
    rng.shuffle(upper)
    table = str.maketrans(string.ascii_lowercase + string.ascii_uppercase, "".join(lower + upper))
    return tuple((rule, [s.translate(table) for s in stops], [c.translate(table) for c in chunks])
                 for rule, stops, chunks in STOP_CASES)


def _run_case(
    buffer_cls: Callable[[list[str]], object], stops: list[str], chunks: Sequence[str]
) -> None:
    """Feed ``chunks`` to the student's buffer and the reference; raise CaseFailure at the first
    difference."""
    reference = StopStringBuffer(stops)
    student = buffer_cls(list(stops))
    sent, done = "", []
    for chunk in chunks:
        expected = reference.push(chunk)
        got = student.push(chunk)
        if got != expected:
            raise CaseFailure(_explain(stops, sent, chunk, expected, got) + _pushes(done))
        sent += got
        done.append(f"push({chunk!r}) -> {got!r}")
        if reference.finished:
            return
    expected, got = reference.flush(), student.flush()
    if got != expected:
        raise CaseFailure(
            f"stops={stops}: flush() returned {got!r} after sending {sent!r}, expected {expected!r}"
            + _pushes(done)
        )


def _pushes(done: list[str]) -> str:
    return "\npushes before it: " + ("; ".join(done) if done else "none (it was the first)")


def _explain(stops: list[str], sent: str, chunk: str, expected: str, got: object) -> str:
    where = (
        f"stops={stops}, after sending {sent!r}, push({chunk!r}) returned {got!r}, expected "
        f"{expected!r}"
    )
    if isinstance(got, str) and got.startswith(expected) and len(got) > len(expected):
        return (
            f"{where}: it leaked {got[len(expected) :]!r}, which may still be the start of a "
            f"stop string"
        )
    if isinstance(got, str) and expected.startswith(got):
        return (
            f"{where}: it held back {expected[len(got) :]!r}, which can no longer start a stop "
            f"string"
        )
    return where


def check_stop_buffer(buffer_cls: Callable[[list[str]], object], verbose: bool = True,
                      seed: int | None = None) -> CheckResult:
    """Run the streaming cases (public, or the hidden ones of ``seed``) against
    ``StopStringBuffer``."""
    table = STOP_CASES if seed is None else hidden_cases(seed)
    cases = [
        Case(rule, lambda stops=stops, chunks=chunks: _run_case(buffer_cls, stops, chunks))
        for rule, stops, chunks in table
    ]
    return run_cases("stop-string buffer", cases, verbose)


def worked_example() -> str:
    """The tag-split case on the reference: what each push returns."""
    _, stops, chunks = STOP_CASES[1]
    buffer = StopStringBuffer(stops)
    lines = [f"stops={stops}"]
    for chunk in chunks:
        lines.append(f"push({chunk!r}) -> {buffer.push(chunk)!r}")
        if buffer.finished:
            break
    return "\n".join(lines)
