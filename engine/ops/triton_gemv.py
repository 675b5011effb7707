"""x @ W^T for one row (a batch-1 decode step) as one Triton launch: a GEMV that streams W once.

At batch 1 a projection is a matrix-vector product bound by reading W. cuBLAS serves GDN's out_proj and attention's
o_proj ([2048, 4096] in the bench model) at batch 1 as a split-K GEMM plus its reduce kernel, two launches. Here each
program owns BLOCK_N output features and walks the whole of K, so there is no partial sum to reduce and one launch. It
loads a [BLOCK_N, BLOCK_K] tile of W and x's [BLOCK_K] slice, multiplies in float32 and keeps the [BLOCK_N, BLOCK_K]
running product, summed over K once at the end (one reduction, not one a tile). Accumulation is float32 and the output
is cast once, as cuBLAS does; the summation order differs from cuBLAS's, so values agree to the dtype's rounding, not
bit for bit.
Measured (benchmarks/decode_tiles.py, H200, 2026-12-04) with W read from HBM, as a decode step reads it: out_proj
6.3 us against cuBLAS's 8.6 (2.6 against 2.0 TB/s), GDN's in_proj [12352, 2048] 13.6 against 16.0, attention's qkv
[9216, 2048] 11.0 against 11.7. From two rows on cuBLAS wins (the GEMV re-reads W per row's product tile in
registers), so the GEMV takes one row only.
Runs under TRITON_INTERPRET=1 on CPU tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class GemvTile:
    block_n: int  # output features a program owns
    block_k: int  # K per step of its loop
    num_warps: int
    num_stages: int = 3  # Triton's default software pipelining of the K loop's loads


def tile_for(k_features: int) -> GemvTile:
    """The measured best tile: long rows (K >= 4096) in few-feature programs of 8 warps with long steps, else more
    features a program in short steps."""
    return GemvTile(4, 1024, 8) if k_features >= 4096 else GemvTile(16, 256, 4)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, n_features, stride_xk, stride_wn, stride_wk, stride_on,
                 K_FEATURES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < n_features
    products = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K_FEATURES, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K_FEATURES
        w = tl.load(w_ptr + n[:, None].to(tl.int64) * stride_wn + k[None, :] * stride_wk,
                    mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_ptr + k * stride_xk, mask=k_ok, other=0.0)
        products += x.to(tl.float32)[None, :] * w.to(tl.float32)
    tl.store(out_ptr + n * stride_on, tl.sum(products, axis=1).to(out_ptr.dtype.element_ty), mask=n_ok)


def triton_gemv(x: torch.Tensor, weight: torch.Tensor, tile: GemvTile | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """x [1, K] (any stride) @ weight [N, K]^T -> [1, N] in x's dtype (`out` if given). `tile` overrides the measured
    choice (benchmarks)."""
    k_features = x.shape[-1]
    if x.dim() != 2 or x.shape[0] != 1 or weight.shape[1] != k_features:
        raise ValueError(f"x {tuple(x.shape)} @ weight {tuple(weight.shape)}^T: the GEMV takes one row of K features")
    n_features = weight.shape[0]
    tile = tile or tile_for(k_features)
    out = x.new_empty((1, n_features)) if out is None else out
    _gemv_kernel[(triton.cdiv(n_features, tile.block_n),)](
        x, weight, out, n_features, x.stride(1), weight.stride(0), weight.stride(1), out.stride(1),
        K_FEATURES=k_features, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )
    return out
