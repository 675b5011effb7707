"""Paged attention: write the step's K/V into cache blocks, then attend per sequence (the PyTorch path).

Caches are [num_blocks, block_size, kv_heads, head_dim]; a token at position p of sequence s lives in block
`block_tables[s][p // block_size]`, row `p % block_size`. On CUDA one Triton launch writes K and V
(engine/ops/triton_decode.py), unless the layer's fused q/k kernel already did (`kv_written`, engine/ops/triton_qk.py);
elsewhere two index assignments do. Queries attend causally over cached + new tokens, with grouped-query heads, through
torch SDPA (flash on CUDA in half precision). A step in which every sequence
decodes goes through one batched kernel instead (engine/ops/paged_decode.py), which also applies a gated layer's
output gate; on the other steps the gate is one elementwise op after attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.ops.paged_decode import gate_output, paged_decode
from engine.step_plan import DecodeBatch, StepContext

try:
    from engine.ops.triton_decode import triton_write_kv
except ImportError:  # no Triton (CPU-only installs): index assignments serve every device
    triton_write_kv = None


@dataclass
class PagedMetadata:
    """Index tensors derived once per step from the StepContext and shared by every attention layer."""

    slot_mapping: torch.Tensor  # [tokens] row of each new token in the cache viewed as [blocks * block_size, ...]
    token_offsets: list[int]  # start of each sequence's tokens in the flat batch (num_seqs + 1)
    cached_lens: list[int]
    block_ids: list[torch.Tensor]  # per sequence: the blocks holding its cached + new tokens, in order
    decode: DecodeBatch | None = None  # every sequence decodes: one batched kernel reads the block table

    @classmethod
    def build(cls, ctx: StepContext) -> PagedMetadata:
        if ctx.decode is not None:
            return cls(ctx.decode.slot_mapping, [], [], [], ctx.decode)
        device, size = ctx.positions.device, ctx.block_size
        slots, block_ids = [], []
        for seq, (cached, new) in enumerate(zip(ctx.cached_lens, ctx.query_lens, strict=True)):
            needed = -(-(cached + new) // size)
            table = ctx.block_tables[seq]
            if len(table) < needed:
                raise ValueError(
                    f"sequence {seq}: {cached + new} tokens need {needed} blocks of {size}; its block table has "
                    f"{len(table)}"
                )
            blocks = torch.tensor(table[:needed], dtype=torch.long, device=device)
            positions = torch.arange(cached, cached + new, dtype=torch.long, device=device)
            slots.append(blocks[positions // size] * size + positions % size)
            block_ids.append(blocks)
        slot_mapping = torch.cat(slots) if slots else torch.empty(0, dtype=torch.long, device=device)
        return cls(slot_mapping, ctx.token_offsets(), list(ctx.cached_lens), block_ids)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             meta: PagedMetadata) -> None:
    """Store the step's keys and values [tokens, kv_heads, head_dim] at their slots (in the cache's dtype)."""
    if triton_write_kv is not None and k.is_cuda:
        triton_write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        return
    rows = k_cache.shape[0] * k_cache.shape[1]
    # Index assignment rather than index_copy_: the latter has no CPU kernel for fp8 caches.
    k_cache.view(rows, *k_cache.shape[2:])[meta.slot_mapping] = k.to(k_cache.dtype)
    v_cache.view(rows, *v_cache.shape[2:])[meta.slot_mapping] = v.to(v_cache.dtype)


def _mask(cached: int, new: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """Boolean [new, cached + new] mask (True = may attend), or None when nothing is masked."""
    if window is None and new == 1:
        return None  # a decode token sees everything before it
    query_pos = torch.arange(cached, cached + new, device=device)[:, None]
    key_pos = torch.arange(cached + new, device=device)[None, :]
    allowed = key_pos <= query_pos
    if window is not None:
        allowed &= key_pos > query_pos - window  # transformers' sliding window: the last `window` tokens
    return allowed


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    meta: PagedMetadata, scale: float, window: int | None = None, gate: torch.Tensor | None = None,
    kv_written: bool = False,
) -> torch.Tensor:
    """q [tokens, heads, head_dim], k/v [tokens, kv_heads, head_dim] (already rotated) -> [tokens, heads, head_dim].
    `gate` [tokens, heads, head_dim] (gated attention): the output is multiplied by sigmoid(gate). `kv_written`: the
    caller already stored this step's keys and values in the caches (engine/ops/triton_qk.py); a decode step then
    reads only the caches, while a prefill's fresh prompts still read k and v."""
    if not kv_written:
        write_kv(k, v, k_cache, v_cache, meta)
    if meta.decode is not None:
        return paged_decode(q, k_cache, v_cache, meta.decode.block_table, meta.decode.context_lens, scale, window,
                            gate)
    out = torch.empty_like(q)
    for seq, cached in enumerate(meta.cached_lens):
        start, end = meta.token_offsets[seq], meta.token_offsets[seq + 1]
        new = end - start
        if new == 0:
            continue
        if cached == 0:
            # A fresh prompt: its keys are exactly this step's, no gather needed.
            keys, values = k[start:end], v[start:end]
        else:
            total = cached + new
            blocks = meta.block_ids[seq]
            keys = k_cache[blocks].reshape(-1, *k_cache.shape[2:])[:total].to(q.dtype)
            values = v_cache[blocks].reshape(-1, *v_cache.shape[2:])[:total].to(q.dtype)
        mask = _mask(cached, new, window, q.device)
        causal = cached == 0 and window is None and new > 1
        attended = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0), attn_mask=None if causal else mask, is_causal=causal,
            scale=scale, enable_gqa=True,
        )
        out[start:end] = attended.squeeze(0).transpose(0, 1)
    return out if gate is None else gate_output(out, gate)
