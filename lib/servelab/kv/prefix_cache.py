"""Prefix-cache keys, and how much of a prompt a prefix cache can reuse: block hashing against a
radix tree.

:func:`prefix_block_key` is the content key of one full KV block, the key the course's
``BlockAllocator`` indexes its prefix cache by; :func:`full_block_keys` chains it over a sequence.
Two designs reuse the K/V of an *exact* token prefix and differ in granularity.

* **Block hashing** (vLLM's automatic prefix caching, and this course's ``BlockAllocator``): every
  *full* block of ``block_size`` tokens is keyed by a hash of its tokens and of the previous block's
  key, so a key names the whole prefix up to the block's end. A lookup walks the new prompt's full
  blocks and stops at the first key not in the index. Reuse comes in whole blocks: the partly
  matching block where two prompts diverge, and a partly filled last block, are recomputed.
* **Radix tree** (SGLang's RadixAttention): cached sequences are stored as a tree of token ids and a
  lookup follows the new prompt token by token, so reuse is the longest common prefix with anything
  cached (with a page size of 1 token, SGLang's default).

Token ids in; keys (SHA-256 chains) or reused token counts out. No K/V, no eviction; the reuse
comparison uses one namespace.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from servelab._validate import require_indices, require_int, require_type

__all__ = [
    "prefix_block_key",
    "full_block_keys",
    "match_blocks",
    "block_hash_keys",
    "block_hash_reuse",
    "radix_reuse",
]


def prefix_block_key(
    parent_key: bytes | None, block_tokens: Sequence[int], namespace: str = ""
) -> bytes:
    """Content key of one full KV block: a SHA-256 chain over namespace, parent key and the block's
    tokens.

    Two blocks get the same key exactly when their whole token prefix (every earlier block and this
    one) is identical *and* the namespace matches, because the parent key already encodes everything
    before. The namespace is the tenant/model/adapter salt: equal tokens under different namespaces
    never share a key. ``parent_key`` is ``None`` for the first block of a sequence.
    """
    if parent_key is not None and not isinstance(parent_key, bytes):
        raise TypeError(f"parent_key must be bytes or None, got {type(parent_key).__name__}")
    require_type("namespace", namespace, str)
    tokens = require_indices("block_tokens", block_tokens, 0, allow_empty=False)
    parent = parent_key if parent_key is not None else b"<root>"
    payload = b"\x00".join(
        (namespace.encode("utf-8"), parent, ",".join(map(str, tokens)).encode("ascii"))
    )
    return hashlib.sha256(payload).digest()


def full_block_keys(tokens: Sequence[int], block_size: int, namespace: str = "") -> list[bytes]:
    """Chain keys (:func:`prefix_block_key`) of every *full* block of ``tokens``, the keys the
    prefix cache indexes; a partial tail block gets no key."""
    keys: list[bytes] = []
    parent: bytes | None = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = prefix_block_key(parent, tokens[start : start + block_size], namespace)
        keys.append(parent)
    return keys


def match_blocks(
    cache: Mapping[bytes, int], tokens: Sequence[int], block_size: int, namespace: str = ""
) -> list[int]:
    """Physical blocks of the longest run of leading full blocks of ``tokens`` whose chain keys are
    in ``cache`` (key -> block), stopping at the first miss: a block-hash prefix-cache lookup."""
    matched: list[int] = []
    parent: bytes | None = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = prefix_block_key(parent, tokens[start : start + block_size], namespace)
        block = cache.get(parent)
        if block is None:
            break
        matched.append(block)
    return matched


def _tokens(name: str, ids: Sequence[int]) -> tuple[int, ...]:
    if isinstance(ids, (str, bytes)) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in ids
    ):
        raise ValueError(f"{name} must be a sequence of int token ids")
    return tuple(ids)


def block_hash_keys(ids: Sequence[int], block_size: int) -> list[bytes]:
    """One chained key per *full* block of ``ids``, ``key_i = hash(key_{i-1}, tokens of block i)``:
    the engine's own prefix-cache keys (:func:`full_block_keys`)."""
    require_int("block_size", block_size, minimum=1)
    return full_block_keys(_tokens("ids", ids), block_size)


def block_hash_reuse(
    cached: Sequence[Sequence[int]], prompt: Sequence[int], block_size: int
) -> int:
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
    """Prompt tokens a radix-tree cache holding ``cached`` sequences can reuse: follow the prompt
    token by token through a trie of the cached sequences (the longest common prefix with any of
    them)."""
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
