"""Block-hash prefix reuse counts whole blocks; radix reuse counts every matching token."""

from __future__ import annotations

import random

import pytest

from servelab.kv.prefix_cache import block_hash_keys, block_hash_reuse, radix_reuse


def common_prefix(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("seed", range(20))
def test_reuse_against_the_common_prefix(seed):
    rng = random.Random(seed)
    shared = [rng.randrange(50) for _ in range(rng.randrange(0, 40))]
    a = shared + [rng.randrange(50, 60) for _ in range(rng.randrange(1, 10))]
    b = shared + [rng.randrange(60, 70) for _ in range(rng.randrange(1, 10))]
    block = rng.randrange(1, 12)
    lcp = common_prefix(a, b)
    assert radix_reuse([a], b) == lcp
    assert block_hash_reuse([a], b, block) == lcp // block * block  # whole blocks only
    assert block_hash_reuse([a], b, 1) == radix_reuse([a], b)  # one-token blocks: the same granularity


def test_chained_keys_name_the_whole_prefix():
    # the same block content after a different first block gets a different key: no mid-prompt reuse
    a, b = [1, 2, 3, 4, 9, 9, 9, 9], [5, 6, 7, 8, 9, 9, 9, 9]
    assert block_hash_keys(a, 4)[1] != block_hash_keys(b, 4)[1]
    assert block_hash_reuse([a], b, 4) == 0
    assert len(block_hash_keys(list(range(11)), 4)) == 2  # the partly filled last block has no key


def test_best_of_several_cached_sequences_and_bad_input():
    cached = [[1, 2, 3, 4, 5, 6], [1, 2, 7, 8]]
    assert radix_reuse(cached, [1, 2, 3, 4, 5, 0]) == 5
    assert block_hash_reuse(cached, [1, 2, 3, 4, 5, 0], 2) == 4
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        block_hash_reuse(cached, [1, 2], 0)
    with pytest.raises(ValueError, match="prompt must be a sequence of int token ids"):
        radix_reuse(cached, "12")
