"""Paged decode attention as a Triton kernel that reads the block table itself (split-K, flash-decoding style).

One program per (sequence, kv head, split): it loads the query heads of its kv head, walks its share of the
sequence's cached tokens through the block table, and keeps an online softmax. Each split's share is worked out on
the device from the sequence's length, so a captured CUDA graph serves any context length. The splits are then
merged by their log-sum-exp weights. Runs under TRITON_INTERPRET=1 on CPU tensors too (that is how CI checks it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # cached tokens per inner iteration
TARGET_PROGRAMS = 264  # about two programs per multiprocessor of an H100/H200


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, acc_ptr, max_ptr, sum_ptr, scale, window,
                   stride_qt, stride_qh, stride_kb, stride_kr, stride_kh, stride_vb, stride_vr, stride_vh, stride_tb,
                   NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                   D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                   PRECISION: tl.constexpr):
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(lens_ptr + seq)
    lowest = tl.where(window > 0, tl.maximum(length - window, 0), 0)  # a sliding window's first key
    share = tl.cdiv(tl.cdiv(length - lowest, SPLITS), BLOCK_N) * BLOCK_N
    start = lowest + split * share
    end = tl.minimum(start + share, length)
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, D_PAD)
    heads = kv_head * GROUP + g
    g_ok, d_ok = g < GROUP, d < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    running_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    running_sum = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    first = start
    while first < end:  # a while loop: Triton's interpreter cannot range() over a loaded bound
        n = first + tl.arange(0, BLOCK_N)
        n_ok = n < end
        page = tl.load(table_ptr + seq * stride_tb + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        row = n % BLOCK_SIZE
        mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + page[:, None] * stride_kb + row[:, None] * stride_kr + kv_head * stride_kh + d[None, :],
                    mask=mask, other=0.0).to(q.dtype)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        scores = tl.where(n_ok[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        rescale = tl.exp(running_max - new_max)
        p = tl.exp(scores - new_max[:, None])
        running_sum = running_sum * rescale + tl.sum(p, 1)
        v = tl.load(v_ptr + page[:, None] * stride_vb + row[:, None] * stride_vr + kv_head * stride_vh + d[None, :],
                    mask=mask, other=0.0).to(q.dtype)
        acc = acc * rescale[:, None] + tl.dot(p.to(q.dtype), v, input_precision=PRECISION)
        running_max = new_max
        first += BLOCK_N
    # Partials are [seq, head, split, ...]: a split with no tokens leaves max -inf and sum 0 (weight 0 when merged).
    row_index = (seq * NUM_HEADS + heads) * SPLITS + split
    tl.store(acc_ptr + row_index[:, None] * HEAD_DIM + d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])
    tl.store(max_ptr + row_index, running_max, mask=g_ok)
    tl.store(sum_ptr + row_index, running_sum, mask=g_ok)


def splits_for(num_seqs: int, num_kv_heads: int) -> int:
    """Enough splits that the grid fills the chip at small batches; one at large batches."""
    return max(1, min(32, TARGET_PROGRAMS // max(1, num_seqs * num_kv_heads)))


def triton_paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                        context_lens: torch.Tensor, scale: float, window: int | None = None) -> torch.Tensor:
    """q [seqs, heads, head_dim]; caches [blocks, block_size, kv_heads, head_dim]; block_table [seqs, width] int32;
    context_lens [seqs] (cached + this token, which is already written); window: attend to the last `window` tokens
    only. Returns [seqs, heads, head_dim]."""
    seqs, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    splits = splits_for(seqs, kv_heads)
    acc = q.new_empty((seqs, heads, splits, head_dim), dtype=torch.float32)
    maxes = q.new_empty((seqs, heads, splits), dtype=torch.float32)
    sums = q.new_empty((seqs, heads, splits), dtype=torch.float32)
    _decode_kernel[(seqs, kv_heads, splits)](
        q, k_cache, v_cache, block_table, context_lens, acc, maxes, sums, scale, window or 0,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_table.stride(0),
        NUM_HEADS=heads, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        D_PAD=max(16, triton.next_power_of_2(head_dim)), BLOCK_SIZE=block_size, BLOCK_N=BLOCK_N, SPLITS=splits,
        PRECISION="ieee" if q.dtype == torch.float32 else None, num_warps=4,
    )
    weights = torch.exp(maxes - maxes.amax(dim=-1, keepdim=True)) * sums  # [seqs, heads, splits]
    merged = (acc * torch.exp(maxes - maxes.amax(dim=-1, keepdim=True))[..., None]).sum(dim=2)
    return (merged / weights.sum(dim=-1)[..., None]).to(q.dtype)
