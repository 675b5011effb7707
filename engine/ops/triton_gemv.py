"""y = x @ weight^T (+ bias) for a handful of rows: a GEMV that streams the weight with every SM busy.

At decode (batch 1..8) a projection reads its whole weight to produce a few rows, so its time is the weight's bytes
over the bandwidth the kernel reaches. cuBLAS tiles such shapes for tensor cores, 64 output columns a CTA: for
[1, 4096] x [2048, 4096]^T that is 32 CTAs on 132 SMs. Here each program owns BLOCK_N weight rows and streams them
along K (contiguous, vectorised loads), multiplying by the few x rows with a broadcast and a sum (no tl.dot: M is tiny
and tensor-core tiles would be mostly padding). Where the column blocks alone do not cover the SMs twice, K is split
too: each split writes float32 partial sums to a workspace and a second small kernel adds them in a fixed order
(deterministic, no atomics), adds the bias and casts. Accumulation is float32; shapes alone pick the launch, so there is
no host sync and a CUDA graph can capture it. Runs under TRITON_INTERPRET=1 on CPU tensors (how the tests check it).
Measured plan: the lead benchmarks gemv against cuBLAS (F.linear) on the H200 at out_proj / o_proj shapes, M = 1..8;
no figures are written here until then.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl

# Rows are padded to a power of two and every program holds ROWS x BLOCK_N x BLOCK_K products per step, with plain
# FMAs: past ~8 rows the registers (hence a narrower BLOCK_K, shorter loads) and the FMA work per weight byte grow,
# while cuBLAS's tensor-core tiles (16+ rows) stop being mostly padding and reuse each weight element across the rows.
# There the GEMM wins; at 1..8 rows both are bound by reading the weight once, and this kernel keeps every SM reading.
MAX_ROWS = 8
PRODUCTS_PER_THREAD = 64  # products a thread holds per K step: BLOCK_K's budget (tune on the card)
MIN_STEPS_PER_SPLIT = 4  # K steps each split keeps: a loop long enough to keep loads in flight
MAX_SPLIT_K = 8  # each split adds 4 B x rows x N of workspace traffic: small next to the weight, not free
H200_SMS = 132  # the interpreter has no SMs: CPU runs choose the tiles the H200 would


@dataclass(frozen=True)
class GemvTiles:
    block_n: int  # weight rows (output columns) per program
    block_k: int  # K per loop step
    split_k: int  # programs sharing one column block, each over a contiguous K range
    num_warps: int = 4


def choose_tiles(rows: int, n: int, k: int, sms: int) -> GemvTiles:
    """Tiles for `rows` rows of x (width k) against n weight rows, on a card with `sms` SMs.

    BLOCK_N = 8: N = 2048 gives 256 column blocks, about two per SM on an H200, each streaming 8 contiguous rows.
    BLOCK_K fills PRODUCTS_PER_THREAD per thread for the padded rows (512 at one row: 8 KB of bf16 weight a step,
    16-byte loads; 128 at eight rows), at least 16 and no wider than K needs.
    SPLIT_K doubles while the programs do not cover every SM once, as long as each split keeps MIN_STEPS_PER_SPLIT
    steps, up to MAX_SPLIT_K: a split costs a second launch (the sum), so it is kept for grids too small to fill the
    card (on the H200, out_proj's 256 blocks unsplit beat split 2 in benchmarks/kernel_speed.py).
    """
    block_n, num_warps = 8, 4
    budget = PRODUCTS_PER_THREAD * 32 * num_warps // (triton.next_power_of_2(rows) * block_n)
    block_k = max(16, min(512, budget, triton.next_power_of_2(k)))
    blocks, steps = triton.cdiv(n, block_n), triton.cdiv(k, block_k)
    split_k = 1
    while (blocks * split_k < sms and steps // (2 * split_k) >= MIN_STEPS_PER_SPLIT
           and split_k < MAX_SPLIT_K):
        split_k *= 2
    return GemvTiles(block_n, block_k, split_k, num_warps)


@lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else H200_SMS


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, rows, n, k, sxm, sxk, swn, sos, som, son,
                 HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 K_PER_SPLIT: tl.constexpr):
    """One column block over one K range; writes out[split] (split stride 0 without a split, else the workspace).
    K_PER_SPLIT is a constant (a layer's K never changes): a fixed trip count, and the interpreter needs one."""
    block, split = tl.program_id(0), tl.program_id(1)
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, ROWS)
    col_ok, row_ok = cols < n, m < rows
    # Both loads address the whole [ROWS, BLOCK_N, BLOCK_K] product (the weight tile repeated over the rows, x over
    # the columns: the repeats hit L1, DRAM serves each byte once), so they share the product's register layout. As
    # [1, BLOCK_N, BLOCK_K] and [ROWS, 1, BLOCK_K] loads each gets its own layout and the weight tile crosses shared
    # memory every step (seen in the sm_90 TTGIR).
    w_rows = tl.broadcast_to(w_ptr + cols.to(tl.int64)[None, :, None] * swn, (ROWS, BLOCK_N, 1))
    x_rows = tl.broadcast_to(x_ptr + m.to(tl.int64)[:, None, None] * sxm, (ROWS, BLOCK_N, 1))
    w_ok = tl.broadcast_to(col_ok[None, :, None], (ROWS, BLOCK_N, 1))
    x_ok = tl.broadcast_to(row_ok[:, None, None], (ROWS, BLOCK_N, 1))
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    start = split * K_PER_SPLIT
    for step in range(0, K_PER_SPLIT, BLOCK_K):  # the last split's steps past K load nothing (masked)
        ks = (start + step + tl.arange(0, BLOCK_K))[None, None, :]
        w = tl.load(w_rows + ks, mask=w_ok & (ks < k), other=0.0).to(tl.float32)
        x = tl.load(x_rows + ks * sxk, mask=x_ok & (ks < k), other=0.0).to(tl.float32)
        acc += tl.sum(x * w, axis=2)
    if HAS_BIAS:  # only without a split: the sum over splits adds it otherwise
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    offsets = split * sos + m[:, None] * som + cols[None, :] * son
    tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _sum_splits_kernel(partial_ptr, bias_ptr, out_ptr, n, sps, spm, som, son,
                       HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """out[row] = sum over splits of partial[split, row] (+ bias), in split order: the same bits every run."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):
        acc += tl.load(partial_ptr + split * sps + row * spm + cols, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * som + cols * son, acc.to(out_ptr.dtype.element_ty), mask=ok)


SUM_BLOCK = 256  # columns per program of the split sum: N = 2048 gives 8 programs a row


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None,
         tiles: GemvTiles | None = None) -> torch.Tensor:
    """x [M, K] (any strides, M <= MAX_ROWS) @ weight [N, K]^T (unit stride along K) + bias [N]: [M, N] in x's dtype
    (`out` if given, any strides). `tiles` overrides choose_tiles (tests force the split-K path with it)."""
    rows, k = x.shape
    n = weight.shape[0]
    if rows > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows, got {rows}: use F.linear")
    if weight.shape[1] != k or weight.stride(1) != 1:
        raise ValueError(f"weight {tuple(weight.shape)} stride {weight.stride()} is not [N, {k}] with unit K stride")
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device) if out is None else out
    if out.shape != (rows, n) or out.dtype != x.dtype:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} is not [{rows}, {n}] {x.dtype}")
    if rows == 0:  # an empty batch: nothing to launch
        return out
    tiles = tiles or choose_tiles(rows, n, k, _sm_count(x.device))
    k_per_split = triton.cdiv(triton.cdiv(k, tiles.split_k), tiles.block_k) * tiles.block_k
    split = tiles.split_k > 1
    target = torch.empty(tiles.split_k, rows, n, dtype=torch.float32, device=x.device) if split else out
    target_strides = target.stride() if split else (0, *out.stride())
    bias_or_any = weight if bias is None else bias  # never read without a bias
    _gemv_kernel[(triton.cdiv(n, tiles.block_n), tiles.split_k)](
        x, weight, bias_or_any, target, rows, n, k, x.stride(0), x.stride(1), weight.stride(0),
        *target_strides, HAS_BIAS=bias is not None and not split, ROWS=triton.next_power_of_2(rows),
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, K_PER_SPLIT=k_per_split, num_warps=tiles.num_warps,
    )
    if split:
        _sum_splits_kernel[(rows, triton.cdiv(n, SUM_BLOCK))](
            target, bias_or_any, out, n, target.stride(0), target.stride(1), out.stride(0), out.stride(1),
            HAS_BIAS=bias is not None, SPLIT_K=tiles.split_k, BLOCK=SUM_BLOCK,
        )
    return out
