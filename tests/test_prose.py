"""servelab.prose writes data as words: flags, counts in agreement, lists and rounded numbers."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.prose import count, listed, rounded, yes_no


def test_flags_are_words():
    assert yes_no(True) == "yes" and yes_no(False) == "no" and yes_no(np.bool_(True)) == "yes"
    with pytest.raises(TypeError):
        yes_no(1)


def test_counts_agree_with_their_noun():
    assert count(1, "block") == "1 block"
    assert count(0, "block") == "0 blocks" and count(2, "token") == "2 tokens"
    assert count(1200, "request") == "1,200 requests"
    assert count(3, "replica", "replicas") == "3 replicas" and count(2, "query", "queries") == "2 queries"
    assert count(np.int64(1), "block") == "1 block"
    with pytest.raises(TypeError):
        count(True, "block")


def test_lists_read_as_a_sentence():
    assert listed([]) == "none" and listed([], empty="no rate") == "no rate"
    assert listed(["a"]) == "a" and listed(["a", "b"]) == "a and b"
    assert listed([1, 2, 3], conjunction="or") == "1, 2 or 3"


def test_rounding_keeps_the_digits_a_claim_needs():
    assert rounded(2.0999999999999996) == 2.1
    assert rounded(0.0123456, 2) == 0.012 and rounded(239925.3, 3) == 240000.0
    assert rounded(0) == 0 and rounded(-1.23456, 2) == -1.2
