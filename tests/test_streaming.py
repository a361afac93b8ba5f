"""Tests for servelab.sampling.stop_strings.StopStringBuffer: chunk-spanning stop strings, no unsafe leaks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.sampling.stop_strings import StopStringBuffer


def reference_truncation(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Independent reference: cut the whole text before the earliest stop (longest on a tie)."""
    hits = [(text.find(s), -len(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    start, _, stop = min(hits)
    return text[:start], stop


def stream(chunks: list[str], stops: list[str]) -> tuple[list[str], StopStringBuffer]:
    buffer = StopStringBuffer(stops)
    emitted = []
    for chunk in chunks:
        emitted.append(buffer.push(chunk))
        if buffer.finished:
            break
    emitted.append(buffer.flush())
    return emitted, buffer


def test_d03_stop_string_split_over_three_chunks():
    buffer = StopStringBuffer(["STOP"])
    pieces = [buffer.push("abcS"), buffer.push("TO"), buffer.push("Pxyz")]
    assert pieces == ["abc", "", ""]
    assert buffer.finished and buffer.finish_reason == "stop" and buffer.matched_stop == "STOP"
    assert buffer.flush() == ""
    # Nothing that could start "STOP" was sent before the match was decided.
    assert all("S" not in piece for piece in pieces)


def test_d03_no_match_is_fully_recovered_by_flush():
    buffer = StopStringBuffer(["STOP"])
    sent = [buffer.push("abcS"), buffer.push("TO"), buffer.push("x"), buffer.push("ST")]
    assert sent == ["abc", "", "STOx", ""]
    assert buffer.held == "ST"
    assert "".join(sent) + buffer.flush() == "abcSTOxST"
    assert buffer.finish_reason is None and buffer.matched_stop is None


def test_held_text_is_the_longest_suffix_that_prefixes_a_stop():
    buffer = StopStringBuffer(["abab"])
    assert buffer.push("xaba") == "x"
    assert buffer.held == "aba"
    assert buffer.push("a") == "aba"  # "abaa": only the last "a" can still start "abab"
    assert buffer.held == "a"


def test_no_stop_strings_pass_everything_through():
    buffer = StopStringBuffer([])
    assert buffer.push("hello ") == "hello "
    assert buffer.push("world") == "world"
    assert buffer.flush() == ""


def test_earliest_match_wins_and_waits_for_longer_candidate():
    buffer = StopStringBuffer(["bc", "abcd"])
    assert buffer.push("xab") == "x"
    assert buffer.push("c") == ""  # "bc" is complete but "abcd" could still start earlier
    assert not buffer.finished
    assert buffer.push("d") == ""
    assert buffer.matched_stop == "abcd"


def test_earlier_candidate_that_fails_yields_the_later_match():
    buffer = StopStringBuffer(["bc", "abcd"])
    out = buffer.push("xabc") + buffer.push("e")
    assert out == "xa"
    assert buffer.matched_stop == "bc"


def test_equal_start_prefers_the_longest_stop():
    buffer = StopStringBuffer(["end", "end of text"])
    assert buffer.push("the end") == "the "
    assert buffer.push(" of text!") == ""
    assert buffer.matched_stop == "end of text"


def test_flush_resolves_a_complete_match_still_waiting():
    buffer = StopStringBuffer(["bc", "abcd"])
    assert buffer.push("xabc") == "x"
    assert buffer.flush() == "a"
    assert buffer.matched_stop == "bc" and buffer.finish_reason == "stop"


def test_push_after_finish_raises():
    buffer = StopStringBuffer(["!"])
    assert buffer.push("hi!there") == "hi"
    with pytest.raises(RuntimeError, match="push after"):
        buffer.push("more")
    flushed = StopStringBuffer(["!"])
    flushed.flush()
    with pytest.raises(RuntimeError, match="push after"):
        flushed.push("more")


@pytest.mark.parametrize("stops, error, pattern", [
    ("STOP", TypeError, "stop_strings"),
    (["ok", ""], ValueError, "stop_strings"),
    (["ok", 3], TypeError, "stop_strings"),
    (None, TypeError, "stop_strings"),
])
def test_constructor_validation(stops, error, pattern):
    with pytest.raises(error, match=pattern):
        StopStringBuffer(stops)


def test_chunk_must_be_str():
    with pytest.raises(TypeError, match="chunk"):
        StopStringBuffer(["x"]).push(b"bytes")


texts = st.text(alphabet="abST", max_size=40)
stop_lists = st.lists(st.text(alphabet="abST", min_size=1, max_size=4), max_size=3)


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=200, deadline=None)
@given(texts, stop_lists, st.lists(st.integers(0, 100), max_size=12))
def test_random_chunking_matches_reference(text, stops, cuts):
    emitted, buffer = stream(chunked(text, cuts), stops)
    expected, stop = reference_truncation(text, stops)
    assert "".join(emitted) == expected
    assert buffer.matched_stop == stop
    assert buffer.finish_reason == ("stop" if stop else None)


@settings(max_examples=200, deadline=None)
@given(texts, stop_lists, st.lists(st.integers(0, 100), max_size=12))
def test_never_emits_text_beyond_what_is_certainly_safe(text, stops, cuts):
    # After each push, the emitted prefix must be a prefix of the final answer for EVERY possible
    # continuation; it suffices that it is a prefix of the reference output of the text seen so far
    # and that no stop string could still start inside it.
    buffer = StopStringBuffer(stops)
    seen, sent = "", ""
    for chunk in chunked(text, cuts):
        sent += buffer.push(chunk)
        seen += chunk
        if buffer.finished:
            break
        assert seen.startswith(sent)
        for start in range(len(sent)):
            tail = seen[start:]
            assert not any(s.startswith(tail) or tail.startswith(s) for s in stops)
    assert sent == reference_truncation(seen, stops)[0] or not buffer.finished and \
        reference_truncation(seen, stops)[0].startswith(sent)
