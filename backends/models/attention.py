"""Paged attention in plain torch: KV written through a slot mapping, read through block tables.

A step's tokens are flattened (``[tokens, heads, head_dim]``). A prompt's first chunk (no
cached prefix, nothing computed before) attends only over its own new keys: it runs alone,
causal, on the step's K and V as they are, with no gather and no mask. Decodes (one query
each) and the other prefill chunks (padded to the longest chunk) go in separate groups, each
split further by context length so that little is padding. For each group the context of
every sequence is gathered from the cache through *its own* block table, a whole block at a
time (padded to the group's longest context): keys of other sequences are never read, and the
additive mask, causal from each query's position, hides both the padding and the unwritten
slots of a sequence's last block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class SeqAttention:
    """What attention needs of one sequence in a step: its block table, how many tokens it
    attends over, where its new tokens start in the step and how many there are."""

    block_table: Sequence[int]
    num_context_tokens: int
    token_offset: int
    num_new_tokens: int


@dataclass(frozen=True, slots=True)
class AttentionGroup:
    query_index: torch.Tensor  # [batch, q_len] rows of the step's tokens (padded with row 0)
    context_blocks: torch.Tensor  # [batch * max_blocks] block tables (padded with block 0)
    # [batch, 1, q_len, max_blocks * block_size]: 0 where a query attends, -inf elsewhere
    mask: torch.Tensor
    output_rows: torch.Tensor  # step rows of the valid queries, in query_index order
    valid: torch.Tensor | None  # [batch * q_len] which padded queries are real (None: all)
    in_step_order: bool  # output_rows is 0, 1, 2, ...


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] the cache slot each new token's KV is written to
    groups: tuple[AttentionGroup, ...]
    num_tokens: int
    block_size: int
    # (first row, rows) of each prompt's first chunk: causal over its own rows only
    first_chunks: tuple[tuple[int, int], ...] = ()


def build_metadata(
    seqs: Sequence[SeqAttention],
    slot_mapping: Sequence[int],
    block_size: int,
    device: torch.device,
    num_query_groups: int = 1,
    dtype: torch.dtype = torch.float32,
) -> AttentionMetadata:
    """Per-step attention inputs; ``num_query_groups`` query heads share each KV head;
    ``dtype`` is the model's (the additive masks')."""
    decodes = [s for s in seqs if s.num_new_tokens == 1]
    first = [s for s in seqs if s.num_new_tokens > 1 and s.num_context_tokens == s.num_new_tokens]
    prefills = [
        s for s in seqs if s.num_new_tokens > 1 and s.num_context_tokens != s.num_new_tokens
    ]
    buckets = [*split_by_context(decodes, block_size), *split_by_context(prefills, block_size)]
    groups = tuple(_group(g, block_size, device, num_query_groups, dtype) for g in buckets if g)
    slots = torch.tensor(slot_mapping, dtype=torch.long, device=device)
    chunks = tuple((s.token_offset, s.num_new_tokens) for s in first)
    return AttentionMetadata(slots, groups, len(slot_mapping), block_size, chunks)


GROUP_COST_BLOCKS = 128  # a group's fixed cost (gathers, attention call), in padded blocks


def split_by_context(seqs: list[SeqAttention], block_size: int) -> list[list[SeqAttention]]:
    """Sequences split into groups of similar context length: each group is padded to its
    longest context (and prefill chunks to the longest chunk), so one group of short and long
    contexts gathers and attends over mostly padding. The
    split minimises ``sum(groups) GROUP_COST_BLOCKS + size * padded blocks`` (exact, by
    dynamic programming over the sequences sorted by context)."""
    if len(seqs) < 2:
        return [seqs]
    ordered = sorted(seqs, key=lambda s: s.num_context_tokens)
    blocks = [-(-s.num_context_tokens // block_size) for s in ordered]
    best = [0] + [1 << 60] * len(ordered)  # best[i]: cost of the first i sequences
    cut = [0] * (len(ordered) + 1)
    for end in range(1, len(ordered) + 1):
        for start in range(end):
            cost = best[start] + GROUP_COST_BLOCKS + (end - start) * blocks[end - 1]
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups: list[list[SeqAttention]] = []
    end = len(ordered)
    while end > 0:
        groups.append(ordered[cut[end] : end])
        end = cut[end]
    return groups


def _group(
    seqs: list[SeqAttention],
    block_size: int,
    device: torch.device,
    num_query_groups: int,
    dtype: torch.dtype,
) -> AttentionGroup:
    q_len = max(s.num_new_tokens for s in seqs)
    max_blocks = max(-(-s.num_context_tokens // block_size) for s in seqs)
    index_rows: list[list[int]] = []
    pos_rows: list[list[int]] = []
    block_rows: list[list[int]] = []
    for seq in seqs:
        n, ctx = seq.num_new_tokens, seq.num_context_tokens
        pad = q_len - n
        index_rows.append([*range(seq.token_offset, seq.token_offset + n), *([0] * pad)])
        pos_rows.append([*range(ctx - n, ctx), *([-1] * pad)])
        table = list(seq.block_table[: -(-ctx // block_size)])
        block_rows.append(table + [0] * (max_blocks - len(table)))
    query_index = torch.tensor(index_rows, dtype=torch.long)
    query_pos = torch.tensor(pos_rows, dtype=torch.long)
    blocks = torch.tensor(block_rows, dtype=torch.long)
    key_pos = torch.arange(max_blocks * block_size)
    mask = key_pos[None, None, :] <= query_pos[:, :, None]  # also hides slots past the context
    mask[:, :, 0] |= query_pos < 0  # a padded query attends to one key: no all-masked row
    if num_query_groups > 1:  # queries laid out [kv_head, group, q_len]: the mask per group
        mask = mask.repeat(1, num_query_groups, 1)
    valid = (query_pos >= 0).reshape(-1)
    rows = query_index.reshape(-1)[valid]
    additive = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))
    return AttentionGroup(
        query_index=query_index.to(device),
        context_blocks=blocks.reshape(-1).to(device),
        mask=additive.unsqueeze(1).to(device),
        output_rows=rows.to(device),
        valid=None if bool(valid.all()) else valid.to(device),
        in_step_order=bool(torch.equal(rows, torch.arange(len(rows)))),
    )


class GatherBuffers:
    """Reused destinations of the context gathers: a fresh multi-megabyte tensor per layer
    would be page-faulted in on every step."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []

    def take(self, index: int, rows: int, like: torch.Tensor) -> torch.Tensor:
        """``rows`` rows shaped as ``like``'s rows, valid until the next ``take(index)``."""
        while len(self._buffers) <= index:
            self._buffers.append(like.new_empty(0))
        buffer = self._buffers[index]
        row_shape = like.shape[1:]
        if buffer.shape[1:] != row_shape or buffer.shape[0] < rows or buffer.device != like.device:
            buffer = like.new_empty((max(rows, 2 * buffer.shape[0]), *row_shape))
            self._buffers[index] = buffer
        return buffer[:rows]


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    buffers: GatherBuffers,
) -> torch.Tensor:
    """``q``: ``[tokens, heads, dim]``, ``k``/``v``: ``[tokens, kv_heads, dim]``; the layer's
    cache is ``[slots, 2, kv_heads, dim]``. Writes the new KV, returns ``[tokens, heads * dim]``.

    The query heads that share a KV head attend as one longer query block (GQA without
    copying the keys per head); contexts are gathered a whole block at a time.
    """
    kv_cache.index_copy_(0, meta.slot_mapping, torch.stack((k, v), dim=1))
    num_heads, dim = q.shape[1], q.shape[2]
    kv_heads = k.shape[1]
    groups_per_kv = num_heads // kv_heads
    paged = kv_cache.view(-1, meta.block_size, 2, kv_heads, dim)
    out = q.new_empty(meta.num_tokens, num_heads, dim)
    for start, rows in meta.first_chunks:
        end = start + rows
        attended = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1).unsqueeze(0),
            k[start:end].transpose(0, 1).unsqueeze(0),
            v[start:end].transpose(0, 1).unsqueeze(0),
            is_causal=True,
            scale=scale,
            enable_gqa=True,
        )
        if len(meta.groups) == 0 and rows == meta.num_tokens:
            return attended[0].transpose(0, 1).reshape(rows, num_heads * dim)
        out[start:end] = attended[0].transpose(0, 1)
    for number, group in enumerate(meta.groups):
        batch, q_len = group.query_index.shape
        queries = (
            q.index_select(0, group.query_index.reshape(-1))  # [batch * q_len, heads, dim]
            .view(batch, q_len, kv_heads, groups_per_kv, dim)
            .permute(0, 2, 3, 1, 4)
            .reshape(batch, kv_heads, groups_per_kv * q_len, dim)
        )
        blocks = group.context_blocks
        gathered = buffers.take(number, len(blocks), paged)
        torch.index_select(paged, 0, blocks, out=gathered)  # [blocks, block_size, 2, kv, dim]
        context = gathered.view(batch, -1, 2, kv_heads, dim)
        keys = context[:, :, 0].transpose(1, 2)
        values = context[:, :, 1].transpose(1, 2)
        attended = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=group.mask, scale=scale
        )
        flat = (
            attended.view(batch, kv_heads, groups_per_kv, q_len, dim)
            .permute(0, 3, 1, 2, 4)
            .reshape(batch * q_len, num_heads, dim)
        )
        if group.valid is not None:
            flat = flat[group.valid]
        if (
            len(meta.groups) == 1
            and not meta.first_chunks
            and group.valid is None
            and group.in_step_order
        ):
            return flat.reshape(meta.num_tokens, num_heads * dim)
        out.index_copy_(0, group.output_rows, flat)
    return out.reshape(meta.num_tokens, num_heads * dim)
