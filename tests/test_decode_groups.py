"""Decode rows grouped by context length (engine/model_runner.py): which rows share a call, which
blocks are read, and that grouping changes no row's attention output."""

import torch

from servelab.engine.kv_cache import KVCache
from servelab.engine.model_runner import DECODE_PAD_KEYS, PagedAttention, build_metadata

BLOCK = 4
KV_HEADS, HEADS, HEAD_DIM = 2, 4, 8


def decode_rows(lengths: list[int], ahead: int = 0) -> list[tuple[int, int, list[int]]]:
    """One decode row per context length, on disjoint blocks; ``ahead`` extra blocks allocated past
    each row's last token."""
    rows, next_block = [], 1
    for length in lengths:
        count = -(-length // BLOCK) + ahead
        rows.append((length - 1, 1, list(range(next_block, next_block + count))))
        next_block += count
    return rows


def test_rows_split_where_padding_would_pass_the_limit():
    long, close, short = 300, 300 - DECODE_PAD_KEYS, 300 - DECODE_PAD_KEYS - 1
    meta = build_metadata(decode_rows([short, long, close]), BLOCK, torch.device("cpu"),
                          torch.float32)
    groups = meta.decode_groups
    assert [g.token_index.tolist() for g in groups] == [[1, 2], [0]]  # longest first
    assert [g.num_keys for g in groups] == [long, short]
    assert groups[0].mask is not None and groups[1].mask is None  # one row: nothing to mask
    assert groups[0].block_tables.shape == (2, -(-long // BLOCK))


def test_blocks_allocated_ahead_are_not_read():
    meta = build_metadata(decode_rows([10, 9], ahead=3), BLOCK, torch.device("cpu"), torch.float32)
    (group,) = meta.decode_groups
    assert group.block_tables.shape == (2, 3)  # ceil(10 / 4) blocks, not 3 + 3


def test_grouping_changes_no_row_output(monkeypatch):
    """The same decode batch attended in one padded call and in length groups: equal outputs."""
    torch.manual_seed(0)
    lengths = [5, 90, 37, 200, 12, 180, 64, 3]
    rows = decode_rows(lengths)
    cache = KVCache(1, 1 + sum(len(t) for _, _, t in rows), BLOCK, KV_HEADS, HEAD_DIM,
                    torch.float32, torch.device("cpu"))
    cache.layer_k[0].normal_()
    cache.layer_v[0].normal_()
    q = torch.randn(len(rows), HEADS, HEAD_DIM)
    k, v = torch.randn(len(rows), KV_HEADS, HEAD_DIM), torch.randn(len(rows), KV_HEADS, HEAD_DIM)
    outputs = {}
    for pad in (10**9, DECODE_PAD_KEYS, 0):
        monkeypatch.setattr("servelab.engine.model_runner.DECODE_PAD_KEYS", pad)
        backend = PagedAttention(cache)
        backend.metadata = build_metadata(rows, BLOCK, torch.device("cpu"), torch.float32)
        outputs[pad] = (len(backend.metadata.decode_groups), backend(0, q, k, v))
    assert [count for count, _ in outputs.values()] == [1, 3, len(lengths)]
    one = outputs[10**9][1]
    for _, out in outputs.values():
        torch.testing.assert_close(out, one, rtol=1e-5, atol=1e-6)
