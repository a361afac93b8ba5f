"""How much of a prompt a prefix cache can reuse: block hashing (vLLM) against a radix tree (SGLang).

Both designs reuse the K/V of an *exact* token prefix; they differ in granularity.

* **Block hashing** (vLLM's automatic prefix caching, and this course's ``BlockAllocator``): every
  *full* block of ``block_size`` tokens is keyed by a hash of its tokens and of the previous block's
  key, so a key names the whole prefix up to the block's end. A lookup walks the new prompt's full
  blocks and stops at the first key not in the index. Reuse comes in whole blocks: the partly
  matching block where two prompts diverge, and a partly filled last block, are recomputed.
* **Radix tree** (SGLang's RadixAttention): cached sequences are stored as a tree of token ids and a
  lookup follows the new prompt token by token, so reuse is the longest common prefix with anything
  cached (with a page size of 1 token, SGLang's default).

System boundary: token ids in, reused token counts out. No K/V, no eviction, one namespace; the block
keys are the allocator's own (SHA-256 chains, :func:`servelab.kv.full_block_keys`).
"""

from __future__ import annotations

from collections.abc import Sequence

from servelab._validate import require_int
from servelab.kv import full_block_keys

__all__ = ["block_hash_keys", "block_hash_reuse", "radix_reuse"]


def _tokens(name: str, ids: Sequence[int]) -> tuple[int, ...]:
    if isinstance(ids, (str, bytes)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError(f"{name} must be a sequence of int token ids")
    return tuple(ids)


def block_hash_keys(ids: Sequence[int], block_size: int) -> list[bytes]:
    """One chained key per *full* block of ``ids``, ``key_i = hash(key_{i-1}, tokens of block i)``: the
    engine's own prefix-cache keys (:func:`servelab.kv.full_block_keys`)."""
    require_int("block_size", block_size, minimum=1)
    return full_block_keys(_tokens("ids", ids), block_size)


def block_hash_reuse(cached: Sequence[Sequence[int]], prompt: Sequence[int], block_size: int) -> int:
    """Prompt tokens a block-hash cache holding ``cached`` sequences can reuse (a multiple of
    ``block_size``): full blocks whose chained key is in the index, up to the first miss."""
    index = {key for seq in cached for key in block_hash_keys(seq, block_size)}
    hits = 0
    for key in block_hash_keys(prompt, block_size):
        if key not in index:
            break
        hits += 1
    return hits * block_size


def radix_reuse(cached: Sequence[Sequence[int]], prompt: Sequence[int]) -> int:
    """Prompt tokens a radix-tree cache holding ``cached`` sequences can reuse: follow the prompt token
    by token through a trie of the cached sequences (the longest common prefix with any of them)."""
    root: dict[int, dict] = {}
    for seq in cached:
        node = root
        for token in _tokens("cached", seq):
            node = node.setdefault(token, {})
    node, matched = root, 0
    for token in _tokens("prompt", prompt):
        if token not in node:
            break
        node, matched = node[token], matched + 1
    return matched
