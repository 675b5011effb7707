"""Paged decode attention as Triton kernels that read the block table themselves (split-K, flash-decoding style), and
the step's K/V written into the cache in one launch.

Decode: one program per (sequence, kv head, split) loads the query heads of its kv head, walks its share of the
sequence's cached tokens through the block table, and keeps an online softmax. Each split's share is worked out on
the device from the sequence's length, so a captured CUDA graph serves any context length. With one split the program
writes the output itself; with several, a second launch (a program per sequence and head) merges the splits by their
log-sum-exp weights. Whichever writes the output multiplies it by sigmoid(gate) first when the layer is gated, and
writes it in q's dtype: a decode step's attention is one or two launches.

Write: one program per token stores its K and V rows at its slot, cast to the cache's dtype as torch casts (to nearest
even; fp8 included, whose conversion on the GPU saturates at ±448, as torch's does). Both run under TRITON_INTERPRET=1
on CPU tensors too (that is how CI checks them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # cached tokens per inner iteration
TARGET_PROGRAMS = 264  # about two programs per multiprocessor of an H100/H200


@triton.jit
def _store_output(out, seq, heads, d, mask, gate_ptr, out_ptr, stride_gt, stride_gh, stride_ot, stride_oh,
                  GATED: tl.constexpr):
    """out (float32) times sigmoid(gate) where gated, stored in the output's dtype (rounded once)."""
    if GATED:
        gate = tl.load(gate_ptr + seq * stride_gt + heads * stride_gh + d, mask=mask, other=0.0).to(tl.float32)
        out = out * tl.sigmoid(gate)
    tl.store(out_ptr + seq * stride_ot + heads * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, acc_ptr, max_ptr, sum_ptr, gate_ptr, out_ptr, scale,
                   window, stride_qt, stride_qh, stride_kb, stride_kr, stride_kh, stride_vb, stride_vr, stride_vh,
                   stride_tb, stride_gt, stride_gh, stride_ot, stride_oh,
                   NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                   D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                   GATED: tl.constexpr, PRECISION: tl.constexpr):
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
    out_mask = g_ok[:, None] & d_ok[None, :]
    if SPLITS == 1:  # this program saw every key: normalise and write the output (padded heads divide by 1)
        out = acc / tl.where(g_ok, running_sum, 1.0)[:, None]
        _store_output(out, seq, heads[:, None], d[None, :], out_mask, gate_ptr, out_ptr, stride_gt, stride_gh,
                      stride_ot, stride_oh, GATED)
    else:
        # Partials are [seq, head, split, ...]: a split with no tokens leaves max -inf and sum 0 (weight 0 merged).
        row_index = (seq * NUM_HEADS + heads) * SPLITS + split
        tl.store(acc_ptr + row_index[:, None] * HEAD_DIM + d[None, :], acc, mask=out_mask)
        tl.store(max_ptr + row_index, running_max, mask=g_ok)
        tl.store(sum_ptr + row_index, running_sum, mask=g_ok)


@triton.jit
def _merge_kernel(acc_ptr, max_ptr, sum_ptr, gate_ptr, out_ptr, stride_gt, stride_gh, stride_ot, stride_oh,
                  NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, SPLITS: tl.constexpr,
                  SPLITS_PAD: tl.constexpr, GATED: tl.constexpr):
    seq, head = tl.program_id(0), tl.program_id(1)
    s, d = tl.arange(0, SPLITS_PAD), tl.arange(0, D_PAD)
    s_ok, d_ok = s < SPLITS, d < HEAD_DIM
    row_index = (seq * NUM_HEADS + head) * SPLITS + s
    maxes = tl.load(max_ptr + row_index, mask=s_ok, other=float("-inf"))
    sums = tl.load(sum_ptr + row_index, mask=s_ok, other=0.0)
    acc = tl.load(acc_ptr + row_index[:, None] * HEAD_DIM + d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    # Split 0 always holds the sequence's first keys (length >= 1), so the top is finite; empty splits weigh 0.
    weights = tl.exp(maxes - tl.max(maxes, 0))
    out = tl.sum(acc * weights[:, None], 0) / tl.sum(sums * weights, 0)
    _store_output(out, seq, head, d, d_ok, gate_ptr, out_ptr, stride_gt, stride_gh, stride_ot, stride_oh, GATED)


def splits_for(num_seqs: int, num_kv_heads: int) -> int:
    """Enough splits that the grid fills the chip at small batches; one at large batches."""
    return max(1, min(32, TARGET_PROGRAMS // max(1, num_seqs * num_kv_heads)))


def triton_paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                        context_lens: torch.Tensor, scale: float, window: int | None = None,
                        gate: torch.Tensor | None = None) -> torch.Tensor:
    """q [seqs, heads, head_dim]; caches [blocks, block_size, kv_heads, head_dim]; block_table [seqs, width] int32;
    context_lens [seqs] (cached + this token, which is already written); window: attend to the last `window` tokens
    only; gate [seqs, heads, head_dim] (any strides but a unit last one): the output is multiplied by sigmoid(gate).
    Returns [seqs, heads, head_dim] in q's dtype."""
    seqs, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = heads // kv_heads
    splits = splits_for(seqs, kv_heads)
    out = q.new_empty((seqs, heads, head_dim))
    if gate is not None and gate.stride(-1) != 1:
        gate = gate.contiguous()
    gate_args = (gate, gate.stride(0), gate.stride(1)) if gate is not None else (out, 0, 0)  # out: never read
    d_pad = max(16, triton.next_power_of_2(head_dim))
    if splits == 1:
        acc = maxes = sums = out  # not written: the kernel stores the output itself
    else:
        acc = q.new_empty((seqs, heads, splits, head_dim), dtype=torch.float32)
        maxes = q.new_empty((seqs, heads, splits), dtype=torch.float32)
        sums = q.new_empty((seqs, heads, splits), dtype=torch.float32)
    _decode_kernel[(seqs, kv_heads, splits)](
        q, k_cache, v_cache, block_table, context_lens, acc, maxes, sums, gate_args[0], out, scale, window or 0,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_table.stride(0), gate_args[1], gate_args[2],
        out.stride(0), out.stride(1),
        NUM_HEADS=heads, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        D_PAD=d_pad, BLOCK_SIZE=block_size, BLOCK_N=BLOCK_N, SPLITS=splits, GATED=gate is not None,
        PRECISION="ieee" if q.dtype == torch.float32 else None, num_warps=4,
    )
    if splits > 1:
        _merge_kernel[(seqs, heads)](
            acc, maxes, sums, gate_args[0], out, gate_args[1], gate_args[2], out.stride(0), out.stride(1),
            NUM_HEADS=heads, HEAD_DIM=head_dim, D_PAD=d_pad, SPLITS=splits,
            SPLITS_PAD=max(2, triton.next_power_of_2(splits)), GATED=gate is not None, num_warps=4,
        )
    return out


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, stride_kt, stride_kh, stride_kd, stride_vt,
                     stride_vh, stride_vd, stride_kb, stride_kr, stride_kch, stride_vb, stride_vr, stride_vch,
                     KV_HEADS: tl.constexpr, H_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    page, row = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    h, d = tl.arange(0, H_PAD)[:, None], tl.arange(0, D_PAD)[None, :]
    mask = (h < KV_HEADS) & (d < HEAD_DIM)
    k = tl.load(k_ptr + token * stride_kt + h * stride_kh + d * stride_kd, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + h * stride_vh + d * stride_vd, mask=mask)
    # Through float32: one rounding to the cache's dtype, to nearest even (fp8 included), as torch's cast.
    tl.store(k_cache_ptr + page * stride_kb + row * stride_kr + h * stride_kch + d,
             k.to(tl.float32).to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + page * stride_vb + row * stride_vr + h * stride_vch + d,
             v.to(tl.float32).to(v_cache_ptr.dtype.element_ty), mask=mask)


def triton_write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    """Store k/v [tokens, kv_heads, head_dim] (any strides) at rows `slot_mapping` [tokens] of the caches
    [blocks, block_size, kv_heads, head_dim] (unit stride along head_dim), cast to the caches' dtype."""
    tokens, kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    _write_kv_kernel[(tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), KV_HEADS=kv_heads, H_PAD=triton.next_power_of_2(kv_heads), HEAD_DIM=head_dim,
        D_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=k_cache.shape[1], num_warps=4,
    )
