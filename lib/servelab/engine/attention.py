"""Paged KV cache and the paged attention backend (pure PyTorch, runs on CPU and CUDA).

The KV cache is one preallocated pool of physical blocks per layer, ``[n_kv_heads, num_blocks,
block_size, head_dim]`` for K and for V (head-major: gathering a sequence's blocks then yields each KV
head's keys as one contiguous run, the layout attention wants). A sequence owns a *block table*:
logical block ``i`` of the sequence (its token positions ``i*block_size .. (i+1)*block_size-1``) lives
in physical block ``block_table[i]``. Token position ``p`` therefore has the flat *slot*
``block_table[p // block_size] * block_size + p % block_size``.

System boundary: the backend sees one layer's rotated q/k/v for a flat batch of tokens drawn from several
sequences (``[num_tokens, heads, head_dim]``). It writes each new token's K/V into its slot, then reads
each sequence's whole history back through its block table (a gather) and attends causally. Which blocks a
sequence owns is decided elsewhere (``servelab.kv.BlockAllocator``); the backend only follows the tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


class KVCache:
    """The physical block pool: K and V tensors of shape ``[layers, kv_heads, num_blocks, block_size, d]``."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (num_layers, num_kv_heads, num_blocks, block_size, head_dim)
        # zeros, not empty: masked-out slots still enter the attention matmul with weight 0, and
        # 0 * NaN from uninitialised memory would poison the output
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self.num_blocks = num_blocks
        # per-layer views, made once: indexing ``k[layer]`` in every layer of every step costs a tensor op
        self.layer_k = list(self.k.unbind(0))  # [kv_heads, num_blocks, block_size, d] each
        self.layer_v = list(self.v.unbind(0))
        self.layer_k_slots = [k.view(num_kv_heads, -1, head_dim) for k in self.layer_k]  # [kv_heads, slots, d]
        self.layer_v_slots = [v.view(num_kv_heads, -1, head_dim) for v in self.layer_v]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        """Bytes one block costs across all layers, K and V: ``2 * L * block_size * kv_heads * d * b``."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: copy physical block ``src`` into ``dst`` in every layer, for each ``(src, dst)``."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.k.device)
        dst = torch.tensor([d for _, d in pairs], device=self.k.device)
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]

    def read_blocks(self, blocks: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the given blocks' K and V (all layers) in host memory: the swap-out half."""
        index = torch.tensor(blocks, device=self.k.device, dtype=torch.long)
        return self.k[:, :, index].to("cpu", copy=True), self.v[:, :, index].to("cpu", copy=True)

    def write_blocks(self, blocks: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Write host copies (from :meth:`read_blocks`) into the given physical blocks: the swap-in half."""
        index = torch.tensor(blocks, device=self.k.device, dtype=torch.long)
        self.k[:, :, index] = k.to(self.k.device)
        self.v[:, :, index] = v.to(self.v.device)


@dataclass
class PrefillGroup:
    """One sequence with several new tokens this step: its flat token range, block table and causal mask."""

    token_start: int  # first index into the flat token batch
    num_tokens: int
    block_table: torch.Tensor  # [num_blocks_of_seq] long
    num_keys: int  # positions 0 .. num_keys-1 of the sequence are attended to
    mask: torch.Tensor | None  # [num_tokens, num_keys] additive (0 = may attend, -inf = not); None = causal


@dataclass
class AttentionMetadata:
    """Everything the backend needs for one forward pass, built once and shared by all layers.

    Decode rows (one new token each) are batched into one attention call; each multi-token row (a prefill
    chunk, or a recompute) gets its own call, so no sequence pays for another one's query length. Keys are
    cut to the longest context, and masks are left out where every key is visible (same-length decode
    rows; a chunk that starts at position 0 is plain causal), which lets SDPA pick its fastest kernel.
    Masks are additive (0 or -inf, in the model's dtype), built once here rather than converted per layer.
    """

    slot_mapping: torch.Tensor  # [num_tokens] long: where each new token's K/V is written
    decode_token_index: torch.Tensor  # [num_decode] long: flat index of each decode token
    decode_block_tables: torch.Tensor  # [num_decode, max_blocks] long (padded with 0)
    decode_num_keys: int  # longest decode context
    decode_mask: torch.Tensor | None  # [num_decode, 1, 1, decode_num_keys] additive; None = all visible
    prefills: list[PrefillGroup]


def build_metadata(rows: list[tuple[int, int, list[int]]], block_size: int, device: torch.device,
                   dtype: torch.dtype) -> AttentionMetadata:
    """Metadata for a flat batch made of ``rows``, each ``(start_position, num_new_tokens, block_table)``.

    Row ``i``'s tokens occupy the next ``num_new_tokens`` entries of the flat batch, at positions
    ``start_position ..``; its block table must cover position ``start_position + num_new_tokens - 1``.
    """
    slots: list[int] = []
    decode_index, decode_tables, decode_lens = [], [], []
    prefills: list[PrefillGroup] = []
    offset = 0
    for start, count, table in rows:
        end = start + count
        if len(table) * block_size < end:
            raise ValueError(f"block table of {len(table)} blocks cannot hold position {end - 1}")
        slots.extend(table[pos // block_size] * block_size + pos % block_size for pos in range(start, end))
        if count == 1:
            decode_index.append(offset)
            decode_tables.append(table)
            decode_lens.append(end)
        else:
            mask = None
            if start > 0:  # earlier positions come from the cache: query i sees keys 0 .. start + i
                visible = torch.arange(end, device=device)[None, :] <= torch.arange(start, end, device=device)[:, None]
                mask = _additive(visible, dtype)
            prefills.append(PrefillGroup(offset, count, torch.tensor(table, device=device), end, mask))
        offset += count
    width = max((len(t) for t in decode_tables), default=1)
    num_keys = max(decode_lens, default=1)
    decode_mask = None
    if any(n != num_keys for n in decode_lens):
        lens = torch.tensor(decode_lens, device=device)
        decode_mask = _additive(torch.arange(num_keys, device=device)[None, :] < lens[:, None], dtype)[:, None, None]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=device, dtype=torch.long),
        decode_token_index=torch.tensor(decode_index, device=device, dtype=torch.long),
        decode_block_tables=torch.tensor([t + [0] * (width - len(t)) for t in decode_tables], device=device,
                                         dtype=torch.long).reshape(-1, width),
        decode_num_keys=num_keys,
        decode_mask=decode_mask,
        prefills=prefills,
    )


def _gather(pool: torch.Tensor, tables: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Read each sequence's history through its block table: ``[S, kv_heads, num_keys, d]``.

    ``pool`` is one layer's ``[kv_heads, num_blocks, block_size, d]``. ``index_select`` over the flattened
    tables copies the blocks in one pass (several times faster on CPU than advanced indexing
    ``pool[:, tables]``, which computes the same thing); the result is a view, no second copy.
    """
    num_seqs, width = tables.shape
    kv_heads, _, block_size, head_dim = pool.shape
    blocks = pool.index_select(1, tables.reshape(-1))  # [kv_heads, S * width, block_size, d]
    return blocks.view(kv_heads, num_seqs, width * block_size, head_dim)[:, :, :num_keys].transpose(0, 1)


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool visibility -> additive mask: 0 where visible, -inf elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(~visible, float("-inf"))


class PagedAttention:
    """Attention backend over the paged pool; set :attr:`metadata` before each forward pass.

    Called as ``backend(layer, q, k, v)`` with q ``[T, n_heads, d]`` and k/v ``[T, n_kv_heads, d]`` for the
    ``T`` new tokens of the step (already RoPE-rotated); returns ``[T, n_heads, d]``.
    """

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.metadata: AttentionMetadata | None = None

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self.metadata
        if meta is None:
            raise RuntimeError("PagedAttention.metadata must be set before the forward pass")
        cache = self.cache
        cache.layer_k_slots[layer].index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
        cache.layer_v_slots[layer].index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
        k_pool, v_pool = cache.layer_k[layer], cache.layer_v[layer]  # [kv_heads, blocks, bs, d]
        if not meta.prefills:  # a pure decode batch: row i of q is sequence i's one new token
            return self._attend_decode(q, k_pool, v_pool, meta)
        out = torch.empty_like(q)
        if meta.decode_token_index.numel():
            out[meta.decode_token_index] = self._attend_decode(q[meta.decode_token_index], k_pool, v_pool, meta)
        for group in meta.prefills:
            rows = slice(group.token_start, group.token_start + group.num_tokens)
            mask = None if group.mask is None else group.mask[None]
            out[rows] = self._attend(q[rows][None], k_pool, v_pool, group.block_table[None], group.num_keys,
                                     mask, causal=group.mask is None)[0]
        return out

    @staticmethod
    def _attend_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                       meta: AttentionMetadata) -> torch.Tensor:
        """One new token per sequence: q ``[S, H, d]`` -> ``[S, H, d]``.

        Grouped-query attention without copying K/V: the ``H / kv_heads`` query heads that share a KV head
        are laid along the query axis of that head, ``[S, kv_heads, group, d]``, so each KV head is read once.
        """
        num_seqs, num_heads, head_dim = q.shape
        kv_heads = k_pool.shape[0]
        keys = _gather(k_pool, meta.decode_block_tables, meta.decode_num_keys)
        values = _gather(v_pool, meta.decode_block_tables, meta.decode_num_keys)
        out = F.scaled_dot_product_attention(q.view(num_seqs, kv_heads, num_heads // kv_heads, head_dim),
                                             keys, values, attn_mask=meta.decode_mask)
        return out.reshape(num_seqs, num_heads, head_dim)

    @staticmethod
    def _attend(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, tables: torch.Tensor, num_keys: int,
                mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
        """q ``[S, Q, H, d]``, tables ``[S, B]``, mask ``[S, Q, num_keys]`` or None -> ``[S, Q, H, d]``."""
        keys = _gather(k_pool, tables, num_keys)
        values = _gather(v_pool, tables, num_keys)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values,
                                             attn_mask=None if mask is None else mask[:, None],
                                             is_causal=causal, enable_gqa=True)
        return out.transpose(1, 2)
