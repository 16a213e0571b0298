"""Paged attention in plain torch: KV written through a slot mapping, read through block tables.

A step's tokens are flattened (``[tokens, heads, head_dim]``). Their sequences are split into
groups that share a query length shape: one group of decodes (one query each) and one of
prefill chunks (padded to the longest chunk). For each group the context of every sequence is
gathered from the cache by the slots of *its own* positions ``0 .. context-1`` (padded to the
longest context), so keys of other sequences and unwritten slots of a last block are never
read; the mask is causal from each query's position and hides the padding.
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
    context_slots: torch.Tensor  # [batch, ctx_len] cache slots (padded with slot 0)
    mask: torch.Tensor  # [batch, 1, q_len, ctx_len] True where a query may attend
    output_rows: torch.Tensor  # step rows of the valid queries, in query_index order
    valid: torch.Tensor | None  # [batch * q_len] which padded queries are real (None: all)


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] the cache slot each new token's KV is written to
    groups: tuple[AttentionGroup, ...]
    num_tokens: int


def build_metadata(
    seqs: Sequence[SeqAttention],
    slot_mapping: Sequence[int],
    block_size: int,
    device: torch.device,
) -> AttentionMetadata:
    decodes = [s for s in seqs if s.num_new_tokens == 1]
    prefills = [s for s in seqs if s.num_new_tokens > 1]
    groups = tuple(_group(g, block_size, device) for g in (decodes, prefills) if g)
    slots = torch.tensor(slot_mapping, dtype=torch.long, device=device)
    return AttentionMetadata(slots, groups, len(slot_mapping))


def _group(seqs: list[SeqAttention], block_size: int, device: torch.device) -> AttentionGroup:
    q_len = max(s.num_new_tokens for s in seqs)
    ctx_len = max(s.num_context_tokens for s in seqs)
    query_index = torch.zeros(len(seqs), q_len, dtype=torch.long)
    context = torch.zeros(len(seqs), ctx_len, dtype=torch.long)
    query_pos = torch.full((len(seqs), q_len), -1, dtype=torch.long)
    key_pos = torch.arange(ctx_len)
    offsets = torch.arange(block_size)
    for row, seq in enumerate(seqs):
        n, ctx = seq.num_new_tokens, seq.num_context_tokens
        query_index[row, :n] = torch.arange(seq.token_offset, seq.token_offset + n)
        query_pos[row, :n] = torch.arange(ctx - n, ctx)
        num_blocks = -(-ctx // block_size)
        table = torch.tensor(list(seq.block_table[:num_blocks]), dtype=torch.long)
        context[row, :ctx] = (table[:, None] * block_size + offsets).reshape(-1)[:ctx]
    mask = key_pos[None, None, :] <= query_pos[:, :, None]
    mask[:, :, 0] |= query_pos < 0  # a padded query attends to one key: no all-masked row
    valid = (query_pos >= 0).reshape(-1)
    rows = query_index.reshape(-1)[valid]
    return AttentionGroup(
        query_index=query_index.to(device),
        context_slots=context.to(device),
        mask=mask.unsqueeze(1).to(device),
        output_rows=rows.to(device),
        valid=None if bool(valid.all()) else valid.to(device),
    )


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """``q``: ``[tokens, heads, dim]``, ``k``/``v``: ``[tokens, kv_heads, dim]``; caches are
    ``[slots, kv_heads, dim]``. Writes the new KV, returns ``[tokens, heads * dim]``."""
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)
    num_heads, dim = q.shape[1], q.shape[2]
    group_size = num_heads // k.shape[1]
    out = q.new_empty(meta.num_tokens, num_heads, dim)
    for group in meta.groups:
        batch, q_len = group.query_index.shape
        queries = q[group.query_index].transpose(1, 2)  # [batch, heads, q_len, dim]
        keys = k_cache[group.context_slots].transpose(1, 2)  # [batch, kv_heads, ctx, dim]
        values = v_cache[group.context_slots].transpose(1, 2)
        if group_size > 1:
            keys = keys.repeat_interleave(group_size, dim=1)
            values = values.repeat_interleave(group_size, dim=1)
        attended = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=group.mask, scale=scale
        )
        flat = attended.transpose(1, 2).reshape(batch * q_len, num_heads, dim)
        if group.valid is not None:
            flat = flat[group.valid]
        out[group.output_rows] = flat
    return out.reshape(meta.num_tokens, num_heads * dim)
