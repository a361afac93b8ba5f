"""KV-cache arithmetic: bytes per token, allocated vs logical slots, sharing counts, KV heads per TP
rank.

How many bytes one token of KV cache costs (``kv_bytes_per_token``), how many token slots a block
allocator hands out for a set of sequences (``block_alloc_slots``: the gap between logical and
allocated slots is internal fragmentation), how many physical blocks those sequences need with and
without prefix sharing, and how KV heads split across tensor-parallel ranks. Plain integers in and
out; units are bytes, blocks or token slots as named. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from servelab._validate import require_index, require_indices
from servelab.kv.prefix_cache import full_block_keys

__all__ = [
    "blocks_for",
    "kv_bytes_per_token",
    "block_alloc_slots",
    "physical_blocks_no_sharing",
    "physical_blocks_with_sharing",
    "kv_heads_per_tp_rank",
]


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` slots (ceiling division)."""
    return -(-num_tokens // block_size)


def kv_bytes_per_token(n_layer: int, n_kv_head: int, d_head: int, bytes_per_elem: int) -> int:
    """Bytes of KV cache one token occupies: ``2 * n_layer * n_kv_head * d_head * bytes_per_elem``.

    The 2 counts K and V. ``n_kv_head`` is the number of *KV* heads (fewer than the query heads
    under GQA/MQA); passing the query-head count overstates the cost by the grouping factor. This is
    the ideal payload: block-table metadata, alignment and quantization scales are not included.

    >>> kv_bytes_per_token(2, 2, 4, 2)
    64
    """
    n_layer = require_index("n_layer", n_layer, 1)
    n_kv_head = require_index("n_kv_head", n_kv_head, 1)
    d_head = require_index("d_head", d_head, 1)
    bytes_per_elem = require_index("bytes_per_elem", bytes_per_elem, 1)
    return 2 * n_layer * n_kv_head * d_head * bytes_per_elem


def block_alloc_slots(lengths: Iterable[int], block_size: int) -> tuple[int, int]:
    """Return ``(logical_slots, allocated_slots)`` for sequences of the given token lengths.

    Logical slots are the tokens actually stored; allocated slots are whole blocks, so every
    sequence rounds up to a multiple of ``block_size``. The difference is internal fragmentation,
    which lives only in each sequence's last block.

    >>> block_alloc_slots([1, 5], 4)
    (6, 12)
    """
    lengths = require_indices("lengths", lengths, 0)
    block_size = require_index("block_size", block_size, 1)
    allocated = sum(blocks_for(n, block_size) for n in lengths) * block_size
    return sum(lengths), allocated


def physical_blocks_no_sharing(lengths: Iterable[int], block_size: int) -> int:
    """Physical blocks for sequences that share nothing: the sum of each one's ``ceil(len /
    block_size)``.

    >>> physical_blocks_no_sharing([6, 7], 4)
    4
    """
    lengths = require_indices("lengths", lengths, 0)
    block_size = require_index("block_size", block_size, 1)
    return sum(blocks_for(n, block_size) for n in lengths)


def physical_blocks_with_sharing(token_sequences: Iterable[Sequence[int]], block_size: int) -> int:
    """Physical blocks for sequences that share full blocks whose entire token prefix matches
    exactly.

    A full block is shared when every token up to and including that block is identical (same chain
    key); a partially filled tail block is always private. An overlap shorter than one block
    therefore shares nothing, and ``n`` sequences with ``B_shared`` common full blocks save
    ``(n - 1) * B_shared`` blocks compared with ``physical_blocks_no_sharing``.

    >>> physical_blocks_with_sharing([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8, 9]], 4)
    3
    """
    if isinstance(token_sequences, (str, bytes)) or not isinstance(token_sequences, Iterable):
        raise TypeError("token_sequences must be an iterable of token-id sequences")
    block_size = require_index("block_size", block_size, 1)
    distinct_full: set[bytes] = set()
    partial_tails = 0
    for i, seq in enumerate(token_sequences):
        tokens = require_indices(f"token_sequences[{i}]", seq, 0)
        distinct_full.update(full_block_keys(tokens, block_size))
        partial_tails += 1 if len(tokens) % block_size else 0
    return len(distinct_full) + partial_tails


def kv_heads_per_tp_rank(n_kv_heads: int, tp_degree: int) -> int:
    """KV heads each tensor-parallel rank stores when heads are split evenly: ``n_kv_heads /
    tp_degree``.

    Raises ValueError when the split is not even (for example 8 KV heads over TP=3, or 4 KV heads
    over TP=8): such a layout needs KV-head replication or a different sharding, not a plain
    division.

    >>> kv_heads_per_tp_rank(8, 4)
    2
    """
    n_kv_heads = require_index("n_kv_heads", n_kv_heads, 1)
    tp_degree = require_index("tp_degree", tp_degree, 1)
    if n_kv_heads % tp_degree:
        raise ValueError(
            f"n_kv_heads={n_kv_heads} is not divisible by tp_degree={tp_degree}: the KV "
            f"heads cannot be "
            "split evenly across ranks; replicate KV heads (when tp_degree > n_kv_heads) "
            "or use another "
            "sharding instead of dividing"
        )
    return n_kv_heads // tp_degree
