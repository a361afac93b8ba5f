"""The forward pass: the paged KV pool, the paged attention backend, the flat batch and the model
runner.

The KV cache is one preallocated pool of physical blocks per layer, ``[n_kv_heads, num_blocks,
block_size, head_dim]`` for K and for V. A sequence's *block table* maps its logical block ``i``
(positions ``i*block_size ..``) to a physical block, so position ``p`` has the flat *slot*
``block_table[p // block_size] * block_size + p % block_size``. One forward pass takes a flat list
of tokens from many sequences (prefill chunks and decode tokens mixed, :class:`ForwardInput`); in
every layer :class:`PagedAttention` writes their K/V into their slots, reads each sequence's history
back through its block table and attends causally. Only the positions whose next token is sampled go
through the LM head. With ``EngineConfig(batch_invariant=True)`` every new token attends alone and
the forward pass runs in :class:`~servelab.engine.batch_invariant.BatchInvariantMode`, so a
request's logits do not depend on the rest of the batch.

System boundary: token ids and block tables in, float32 logits ``[sampled_rows, vocab]`` out (any
device); which blocks a sequence owns is the allocator's decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

from servelab.device import resolve_device_dtype
from servelab.engine import gpu_memory
from servelab.engine.batch_invariant import BatchInvariantMode, attend_rowwise
from servelab.engine.config import EngineConfig
from servelab.engine import kv_pool_size
from servelab.engine.cpu_linear import pack_linears
from servelab.engine.kv_cache import KVCache
from servelab.engine.kv_pool_size import PoolSize
from servelab.engine.logprobs import ScoreRow, score_rows
from servelab.engine.scheduler import ScheduledChunk
from servelab.engine.sequence import EngineSequence
from servelab.engine.swap import host_swap_space
from servelab.model.llama import LlamaForCausalLM


@dataclass
class PrefillGroup:
    """One sequence with several new tokens this step (in batch-invariant mode: one or more): its
    flat token range, block table and causal mask."""

    token_start: int  # first index into the flat token batch
    num_tokens: int
    block_table: torch.Tensor  # [num_blocks_of_seq] long
    num_keys: int  # positions 0 .. num_keys-1 of the sequence are attended to
    # [num_tokens, num_keys] additive (0 = may attend, -inf = not); None = causal
    mask: torch.Tensor | None


@dataclass
class DecodeGroup:
    """Decode rows (one new token each) of similar context length, attended in one call: keys cut to
    the group's longest context, a mask only where the rows' lengths differ."""

    token_index: torch.Tensor  # [rows] long: flat index of each row's new token
    block_tables: torch.Tensor  # [rows, max_blocks] long (padded with 0)
    num_keys: int  # the group's longest context
    # [rows, 1, 1, num_keys] additive; None = every row sees every key
    mask: torch.Tensor | None


DECODE_PAD_KEYS = 64
"""A decode row joins a group when its context is at most this many keys shorter than the group's
longest; a longer run of padding costs more than one more attention call. Measured on SmolLM2-135M
(2-core AMD EPYC, fp32, interleaved): the paged attention of 8 and 32 rows of 50-314 tokens alone
took 15-20 % less time with groups split at 64 keys than in one call padded to the longest; end to
end, 32 requests ran 1.12x (band 1.08-1.21x) and 8 requests 1.00x (band 0.90-1.15x) the speed of one
padded call, both inside that machine's run-to-run drift (``servelab.bench.timing.RESOLUTION``)."""


@dataclass
class AttentionMetadata:
    """Everything the backend needs for one forward pass, built once and shared by all layers.
    Decode rows (one new token each) are sorted by context length into :class:`DecodeGroup` s, one
    attention call each, so a short row does not pay for the batch's longest (vLLM's kernels skip
    the padding altogether; here a group's rows are padded to its longest). Each multi-token row (a
    prefill chunk, a recompute) gets its own call, so no sequence pays for another's query length.
    Masks are left out where every key is visible (same-length decode rows; a chunk from position 0
    is plain causal), so SDPA can pick its fastest kernel. Masks are additive (0 or -inf, in the
    model's dtype).
    ``batch_invariant``: every row, decode rows included, is a group without a mask, and each of its
    tokens attends alone (:func:`servelab.engine.batch_invariant.attend_rowwise`)."""

    slot_mapping: torch.Tensor  # [num_tokens] long: where each new token's K/V is written
    decode_groups: list[DecodeGroup]
    prefills: list[PrefillGroup]
    batch_invariant: bool = False


def build_metadata(rows: list[tuple[int, int, list[int]]], block_size: int, device: torch.device,
                   dtype: torch.dtype, batch_invariant: bool = False) -> AttentionMetadata:
    """Metadata for a flat batch made of ``rows``, each ``(start_position, num_new_tokens,
    block_table)``. Row ``i``'s tokens occupy the next ``num_new_tokens`` entries of the flat batch,
    at positions ``start_position ..``; its block table must cover position ``start_position +
    num_new_tokens - 1``. ``batch_invariant``: every row becomes a :class:`PrefillGroup` without a
    mask (see :class:`AttentionMetadata`)."""
    slots: list[int] = []
    decode: list[tuple[int, list[int], int]] = []  # (flat index, block table, context length)
    prefills: list[PrefillGroup] = []
    offset = 0
    for start, count, table in rows:
        end = start + count
        if len(table) * block_size < end:
            raise ValueError(f"block table of {len(table)} blocks cannot hold position {end - 1}")
        slots.extend(
            table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)
        )
        if count == 1 and not batch_invariant:
            decode.append((offset, table, end))
        else:
            mask = None
            if start > 0 and not batch_invariant:  # query i sees cached keys 0 .. start + i
                visible = (
                    torch.arange(end, device=device)[None, :]
                    <= torch.arange(start, end, device=device)[:, None]
                )
                mask = _additive(visible, dtype)
            prefills.append(
                # only the blocks that hold positions 0 .. end - 1 are read
                PrefillGroup(offset, count, torch.tensor(table[:-(-end // block_size)],
                                                         device=device), end, mask)
            )
        offset += count
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=device, dtype=torch.long),
        decode_groups=[
            _decode_group(group, block_size, device, dtype) for group in _by_length(decode)
        ],
        prefills=prefills,
        batch_invariant=batch_invariant,
    )


def _by_length(decode: list[tuple[int, list[int], int]]) -> list[list[tuple[int, list[int], int]]]:
    """Decode rows ``(flat index, block table, context length)`` split into groups, longest first: a
    row starts a new group when it is more than :data:`DECODE_PAD_KEYS` keys shorter than its
    group's first row."""
    groups: list[list[tuple[int, list[int], int]]] = []
    for row in sorted(decode, key=lambda row: -row[2]):
        if groups and groups[-1][0][2] - row[2] <= DECODE_PAD_KEYS:
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def _decode_group(rows: list[tuple[int, list[int], int]], block_size: int, device: torch.device,
                  dtype: torch.dtype) -> DecodeGroup:
    """One :class:`DecodeGroup` from its rows ``(flat index, block table, context length)``, the
    longest first. Only the blocks that hold the group's longest context are read: a table's
    blocks allocated ahead of its tokens are left out."""
    num_keys = rows[0][2]
    width = -(-num_keys // block_size)
    mask = None
    if any(length != num_keys for _, _, length in rows):
        lens = torch.tensor([length for _, _, length in rows], device=device)
        mask = _additive(torch.arange(num_keys, device=device)[None, :] < lens[:, None], dtype)
        mask = mask[:, None, None]
    return DecodeGroup(
        token_index=torch.tensor([index for index, _, _ in rows], device=device, dtype=torch.long),
        block_tables=torch.tensor(
            [table[:width] + [0] * (width - len(table)) for _, table, _ in rows], device=device,
            dtype=torch.long,
        ),
        num_keys=num_keys,
        mask=mask,
    )


def _gather(pool: torch.Tensor, tables: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Read each sequence's history through its block table: ``[S, kv_heads, num_keys, d]`` from one
    layer's ``[kv_heads, num_blocks, block_size, d]`` pool. ``index_select`` over the flattened
    tables copies the blocks in one pass (several times faster on CPU than ``pool[:, tables]``); the
    result is a view."""
    num_seqs, width = tables.shape
    kv_heads, _, block_size, head_dim = pool.shape
    blocks = pool.index_select(1, tables.reshape(-1))  # [kv_heads, S * width, block_size, d]
    return blocks.view(kv_heads, num_seqs, width * block_size, head_dim)[:, :, :num_keys].transpose(
        0, 1
    )


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool visibility -> additive mask: 0 where visible, -inf elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(
        ~visible, float("-inf")
    )


class PagedAttention:
    """Attention backend over the paged pool; set :attr:`metadata` before each forward pass. Called
    as ``backend(layer, q, k, v)`` with q ``[T, n_heads, d]`` and k/v ``[T, n_kv_heads, d]`` for the
    ``T`` new tokens of the step (already RoPE-rotated); returns ``[T, n_heads, d]``."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.metadata: AttentionMetadata | None = None

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        meta = self.metadata
        if meta is None:
            raise RuntimeError("PagedAttention.metadata must be set before the forward pass")
        cache = self.cache
        cache.layer_k_slots[layer].index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
        cache.layer_v_slots[layer].index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
        k_pool, v_pool = cache.layer_k[layer], cache.layer_v[layer]  # [kv_heads, blocks, bs, d]
        if meta.batch_invariant:
            return self._attend_per_token(q, k_pool, v_pool, meta)
        out = torch.empty_like(q)
        for decode in meta.decode_groups:
            out[decode.token_index] = self._attend_decode(
                q[decode.token_index], k_pool, v_pool, decode
            )
        for group in meta.prefills:
            rows = slice(group.token_start, group.token_start + group.num_tokens)
            mask = None if group.mask is None else group.mask[None]
            out[rows] = self._attend(
                q[rows][None],
                k_pool,
                v_pool,
                group.block_table[None],
                group.num_keys,
                mask,
                causal=group.mask is None,
            )[0]
        return out

    @staticmethod
    def _attend_per_token(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                          meta: AttentionMetadata) -> torch.Tensor:
        """Batch-invariant mode: each group's history gathered once, then every new token attends
        alone to the keys it may see (:func:`~servelab.engine.batch_invariant.attend_rowwise`)."""
        out = torch.empty_like(q)
        for group in meta.prefills:
            rows = slice(group.token_start, group.token_start + group.num_tokens)
            keys = _gather(k_pool, group.block_table[None], group.num_keys)[0]  # [kv, keys, d]
            values = _gather(v_pool, group.block_table[None], group.num_keys)[0]
            out[rows] = attend_rowwise(q[rows], keys, values, group.num_keys - group.num_tokens)
        return out

    @staticmethod
    def _attend_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                       group: DecodeGroup) -> torch.Tensor:
        """One new token per sequence of ``group``: q ``[S, H, d]`` -> ``[S, H, d]``. Grouped-query
        attention without copying K/V: the ``H / kv_heads`` query heads that share a KV head are
        laid along the query axis of that head, ``[S, kv_heads, group, d]``, so each KV head is read
        once."""
        num_seqs, num_heads, head_dim = q.shape
        kv_heads = k_pool.shape[0]
        keys = _gather(k_pool, group.block_tables, group.num_keys)
        values = _gather(v_pool, group.block_tables, group.num_keys)
        out = F.scaled_dot_product_attention(
            q.view(num_seqs, kv_heads, num_heads // kv_heads, head_dim),
            keys,
            values,
            attn_mask=group.mask,
        )
        return out.reshape(num_seqs, num_heads, head_dim)

    @staticmethod
    def _attend(
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        tables: torch.Tensor,
        num_keys: int,
        mask: torch.Tensor | None,
        causal: bool,
    ) -> torch.Tensor:
        """q ``[S, Q, H, d]``, tables ``[S, B]``, mask ``[S, Q, num_keys]`` or None -> ``[S, Q, H,
        d]``."""
        keys = _gather(k_pool, tables, num_keys)
        values = _gather(v_pool, tables, num_keys)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values,
                                             attn_mask=None if mask is None else mask[:, None],
                                             is_causal=causal, enable_gqa=True)
        return out.transpose(1, 2)


class ChunkSpan(NamedTuple):
    """Where one scheduled chunk sits in the pool: ``num_tokens`` tokens from position ``start``,
    whose K/V go into (and whose history is read from) the physical blocks of ``block_table``."""

    start: int
    num_tokens: int
    block_table: list[int]


@dataclass
class ForwardInput:
    """One forward pass's batch, flattened: every chunk's tokens one after another. ``token_ids[i]``
    sits at absolute position ``positions[i]``; ``spans`` say which block table each chunk's tokens
    use (attention metadata); ``sample_indices`` are the flat indices of the last token of each
    chunk whose logits are sampled, in chunk order (a verify row of speculative decoding samples all
    ``1 + len(draft_ids)`` of its positions). ``score_rows``: the prompt positions whose logits
    score the next prompt token (only for ``prompt_logprobs``,
    :func:`~servelab.engine.logprobs.score_rows`)."""

    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    spans: list[ChunkSpan] = field(default_factory=list)
    sample_indices: list[int] = field(default_factory=list)
    score_rows: list[ScoreRow] = field(default_factory=list)

    @classmethod
    def from_chunks(
        cls, chunks: Iterable[tuple[ScheduledChunk, EngineSequence, list[int]]]
    ) -> "ForwardInput":
        """Flatten ``(chunk, its sequence, its block table)`` triples in batch order."""
        batch = cls()
        for chunk, seq, table in chunks:
            end = chunk.start + chunk.num_tokens
            if seq.params.prompt_logprobs is not None:
                batch.score_rows += score_rows(seq, chunk.start, end, len(batch.token_ids))
            drafts = chunk.draft_ids
            batch.token_ids += seq.tokens_between(chunk.start, end - len(drafts))
            batch.token_ids += drafts
            batch.positions += range(chunk.start, end)
            batch.spans.append(ChunkSpan(chunk.start, chunk.num_tokens, table))
            if chunk.emits_token:
                last = len(batch.token_ids)
                batch.sample_indices += range(last - 1 - len(drafts), last)
        return batch


class ModelRunner:
    """Runs :class:`LlamaForCausalLM` over a paged KV pool of ``config.num_blocks`` blocks (else
    what :func:`pool_blocks` sizes from the memory there is, :attr:`pool_size`). The model moves to
    the configured device and dtype in place, its CPU linear weights packed for oneDNN
    (:mod:`servelab.engine.cpu_linear`). With ``config.batch_invariant`` each forward pass runs in
    :class:`~servelab.engine.batch_invariant.BatchInvariantMode`; the model itself is not changed,
    so engines with and without it can share one model."""

    def __init__(self, model: LlamaForCausalLM, config: EngineConfig) -> None:
        self.device, self.dtype = resolve_device_dtype(config, model)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        # steps of several rows through oneDNN (servelab.engine.cpu_linear)
        pack_linears(self.model)
        cfg = model.config
        self.block_size = config.block_size
        self.batch_invariant = config.batch_invariant
        self.bytes_per_block = gpu_memory.kv_block_bytes(cfg, config.block_size, self.dtype)
        # checked by the engine
        self.max_model_len = config.max_model_len or cfg.max_position_embeddings
        self.num_blocks = config.num_blocks or pool_blocks(self, config, self.max_model_len)
        self.cache = KVCache(cfg.num_hidden_layers, self.num_blocks, config.block_size,
                             cfg.num_key_value_heads, cfg.head_dim, self.dtype, self.device)
        self.backend = PagedAttention(self.cache)
        self.host_swap = host_swap_space(config, self.cache, self.bytes_per_block)

    @property
    def pool_size(self) -> PoolSize:
        """The KV pool in blocks, tokens and bytes, and how many ``max_model_len`` requests it
        holds."""
        return PoolSize(self.num_blocks, self.block_size, self.bytes_per_block, self.max_model_len,
                        self.device.type)

    @torch.inference_mode()
    def execute(self, batch: ForwardInput) -> torch.Tensor:
        """One forward pass over ``batch``. Returns float32 logits ``[len(sample_indices) +
        len(score_rows), vocab]``: one row per sampled chunk, in chunk order, then the score
        rows."""
        self.backend.metadata = build_metadata(batch.spans, self.block_size, self.device,
                                               self.dtype, self.batch_invariant)
        with BatchInvariantMode() if self.batch_invariant else nullcontext():
            try:
                hidden = self.model.hidden_states(torch.tensor(batch.token_ids, device=self.device),
                                                  torch.tensor(batch.positions, device=self.device),
                                                  self.backend)
            finally:
                self.backend.metadata = None
            if batch.score_rows or len(batch.sample_indices) < len(batch.token_ids):  # else: decode
                rows = batch.sample_indices + [row.index for row in batch.score_rows]
                hidden = hidden[torch.tensor(rows, device=self.device, dtype=torch.long)]
            return self.model.lm_head(hidden).float()


def pool_blocks(runner: ModelRunner, config: EngineConfig, max_model_len: int) -> int:
    """Blocks for a pool whose size ``config.num_blocks`` leaves open
    (:mod:`servelab.engine.kv_pool_size`): as many as an explicit ``config.kv_cache_memory_bytes``
    pays for (``runner.bytes_per_block = 2 * layers * block_size * kv_heads * head_dim *
    bytes_per_element``); else on CUDA what :func:`blocks_from_gpu_memory` finds (all of it when
    ``gpu_memory_utilization`` is set), on a CPU a share of the available memory; by default at
    most what ``max_num_seqs`` sequences of ``max_model_len`` tokens fill."""
    if config.kv_cache_memory_bytes is not None:
        return max(1, config.kv_cache_memory_bytes // runner.bytes_per_block)
    if runner.device.type == "cuda":
        blocks = blocks_from_gpu_memory(runner, config)
        if config.gpu_memory_utilization is not None:  # asked for by name: all of it, as vLLM does
            return blocks
    else:
        blocks = kv_pool_size.kv_blocks_for_cpu(kv_pool_size.available_memory_bytes(),
                                                runner.bytes_per_block)
    return min(blocks, kv_pool_size.max_useful_blocks(config.max_num_seqs, max_model_len,
                                                      config.block_size))


def blocks_from_gpu_memory(runner: ModelRunner, config: EngineConfig) -> int:
    """Profile one forward pass of ``max_num_batched_tokens`` tokens (one sequence from position 0,
    its last ``max_num_seqs`` rows through the LM head) over a pool just large enough, then size the
    real pool from what the device has left
    (:func:`servelab.engine.gpu_memory.kv_blocks_for_gpu`)."""
    cfg = runner.model.config
    tokens = min(config.max_num_batched_tokens, config.max_model_len or cfg.max_position_embeddings)
    blocks = -(-tokens // config.block_size)
    rows = min(config.max_num_seqs, tokens)
    batch = ForwardInput(token_ids=[0] * tokens, positions=list(range(tokens)),
                         spans=[ChunkSpan(0, tokens, list(range(blocks)))],
                         sample_indices=list(range(tokens - rows, tokens)))

    def profile() -> None:
        runner.backend = PagedAttention(
            KVCache(
                cfg.num_hidden_layers,
                blocks,
                config.block_size,
                cfg.num_key_value_heads,
                cfg.head_dim,
                runner.dtype,
                runner.device,
            )
        )
        runner.execute(batch)
        del runner.backend

    seen = gpu_memory.measure_cuda_memory(runner.device, profile)
    utilization = config.gpu_memory_utilization or kv_pool_size.DEFAULT_GPU_MEMORY_UTILIZATION
    return gpu_memory.kv_blocks_for_gpu(seen.total_bytes, utilization, seen.used_bytes,
                             seen.activation_peak_bytes, runner.bytes_per_block)


def decode_step_logits(runner: ModelRunner, sequences: list[list[int]]) -> torch.Tensor:
    """Float32 logits ``[len(sequences), vocab]`` of one decode step that takes the last token of
    every sequence (token ids) together, as an engine step of that batch does: one pass first
    prefills all tokens but the last of each, every sequence in blocks of its own from block 0 up.
    For a runner that no engine uses (it overwrites those blocks); to see one batch's effect on
    logits, compare the rows of one call over all sequences with calls over each alone."""
    if not sequences or any(len(seq) < 2 for seq in sequences):
        raise ValueError("sequences must be a non-empty list of token lists, each of 2 or more")
    tables, first_free = [], 0
    for seq in sequences:
        width = -(-len(seq) // runner.block_size)
        tables.append(list(range(first_free, first_free + width)))
        first_free += width
    if first_free > runner.num_blocks:
        raise ValueError(f"sequences need {first_free} KV blocks, the runner has "
                         f"{runner.num_blocks}")
    prefill = ForwardInput()
    for seq, table in zip(sequences, tables):
        prefill.token_ids += seq[:-1]
        prefill.positions += range(len(seq) - 1)
        prefill.spans.append(ChunkSpan(0, len(seq) - 1, table))
    prefill.sample_indices = [len(prefill.token_ids) - 1]
    runner.execute(prefill)
    decode = ForwardInput(token_ids=[seq[-1] for seq in sequences],
                          positions=[len(seq) - 1 for seq in sequences],
                          spans=[ChunkSpan(len(seq) - 1, 1, table)
                                 for seq, table in zip(sequences, tables)],
                          sample_indices=list(range(len(sequences))))
    return runner.execute(decode)
