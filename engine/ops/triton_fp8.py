"""x @ W^T for block-scaled FP8 weights (Qwen's and DeepSeek's fine-grained fp8): two Triton paths.

Layout: weight float8_e4m3fn [N, K]; scale_inv float32 [ceil(N/bn), ceil(K/bk)] for block (bn, bk), 128 x 128 as
published; the weight the checkpoint means is w[n, k] = float(weight[n, k]) * scale_inv[n // bn, k // bk].

- W8A16 (any GPU Triton runs on, and the interpreter): the kernel dequantizes each [BLOCK_N, BLOCK_K] tile in float32
  (fp8_weight_rows: each element times its block's scale, one scale a row where the tile aligns with the blocks,
  gathered otherwise, so any block shape works) and multiplies it with x in x's dtype.
  Decode (M <= 16) runs one M-block a feature slice, so the weight is streamed once: a lone row multiplies
  elementwise and sums over K once at the end (triton_gemv's GEMV: no tensor-core tile is three quarters padding),
  2..16 rows take a 16-row tl.dot. Prefill takes wide tiles.
- W8A8 (Hopper, sm_90): x is quantized per token and per bk columns (scale = absmax / 448, as DeepSeek-V3's
  per-token-group quantization), then an fp8 x fp8 tl.dot per K block of bk, each product scaled by its token's and
  its weight block's scales before it is added (vLLM's w8a8_block_fp8_matmul does the same; ours is written anew).
  fp8 tensor cores are twice bf16's rate, at the price of x's rounding to fp8 (~2^-4 relative per element).
`fp8_path` says which serves. Accumulation is float32; the output is cast once to x's dtype.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch
import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)  # float8_e4m3fn's largest finite value
W8A8_MIN_ROWS = 65  # fewer rows stream the weight (bandwidth-bound): W8A16 reads the same bytes without x's rounding
X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

Fp8Path = Literal["w8a16", "w8a8"]


@dataclass(frozen=True)
class QuantTile:
    """One launch shape of a dequantizing matmul (shared by engine/ops/triton_w4a16.py)."""

    block_m: int  # rows a program owns (1: the GEMV, no tensor-core tile)
    block_n: int  # output features a program owns
    block_k: int  # K per step of its loop
    num_warps: int
    num_stages: int


def dequant_tile(rows: int) -> QuantTile:
    """The launch shape for M rows: decode streams the weight in narrow feature slices, prefill takes wide tiles."""
    if rows == 1:
        return QuantTile(1, 16, 256, 4, 3)
    if rows <= 16:
        return QuantTile(16, 32, 128, 4, 4)
    if rows <= 64:
        return QuantTile(64, 64, 64, 4, 3)
    return QuantTile(128, 128, 64, 8, 3)


def precision(dtype: torch.dtype) -> str | None:
    return "ieee" if dtype == torch.float32 else None  # fp32 (the interpreter tests) must not round through tf32


@triton.jit
def fp8_weight_rows(w_ptr, s_ptr, n, n_ok, k0, K, stride_wn, stride_wk, stride_sn, stride_sk,
                    SCALE_N: tl.constexpr, SCALE_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The float32 weights of rows n ([BLOCK_N]) at columns k0 .. k0 + BLOCK_K: [BLOCK_N, BLOCK_K], each fp8 value
    times its block's scale. A tile inside one scale column (SCALE_K a multiple of BLOCK_K) or spanning whole ones
    (BLOCK_K a multiple of SCALE_K, both powers of two) loads one scale a row and column block, so the loads the
    pipeline stages are the fp8 bytes, not a float32 scale per element; other blocks gather the scales."""
    k = k0 + tl.arange(0, BLOCK_K)
    k_ok = k < K
    rows = n.to(tl.int64)
    w = tl.load(w_ptr + rows[:, None] * stride_wn + k[None, :] * stride_wk, mask=n_ok[:, None] & k_ok[None, :],
                other=0.0).to(tl.float32)
    scale_rows = s_ptr + (n // SCALE_N) * stride_sn
    if SCALE_K % BLOCK_K == 0:
        w = w * tl.load(scale_rows + (k0 // SCALE_K) * stride_sk, mask=n_ok, other=0.0)[:, None]
    elif BLOCK_K % SCALE_K == 0 and (SCALE_K & (SCALE_K - 1)) == 0:
        columns = k0 // SCALE_K + tl.arange(0, BLOCK_K // SCALE_K)
        scales = tl.load(scale_rows[:, None] + columns[None, :] * stride_sk,
                         mask=n_ok[:, None] & (columns[None, :] * SCALE_K < K), other=0.0)
        w = tl.reshape(tl.reshape(w, (BLOCK_N, BLOCK_K // SCALE_K, SCALE_K)) * scales[:, :, None],
                       (BLOCK_N, BLOCK_K))
    else:
        w = w * tl.load(scale_rows[:, None] + (k // SCALE_K)[None, :] * stride_sk,
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    return w


@triton.jit
def _w8a16_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, stride_xm, stride_xk, stride_wn, stride_wk, stride_sn,
                  stride_sk, stride_ym, stride_yn, K: tl.constexpr, SCALE_N: tl.constexpr, SCALE_K: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = m < M, n < N
    if BLOCK_M == 1:
        products = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = fp8_weight_rows(w_ptr, s_ptr, n, n_ok, k0, K, stride_wn, stride_wk, stride_sn, stride_sk, SCALE_N,
                            SCALE_K, BLOCK_N, BLOCK_K)
        if BLOCK_M == 1:
            x = tl.load(x_ptr + pid_m * stride_xm + k * stride_xk, mask=k_ok, other=0.0)
            products += x.to(tl.float32)[None, :] * w
        else:
            x = tl.load(x_ptr + m[:, None].to(tl.int64) * stride_xm + k[None, :] * stride_xk,
                        mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=PRECISION)
    if BLOCK_M == 1:
        acc = tl.sum(products, axis=1)[None, :]
    tl.store(y_ptr + m[:, None].to(tl.int64) * stride_ym + n[None, :] * stride_yn, acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, stride_xm, stride_qm, stride_sm, K: tl.constexpr, GROUP: tl.constexpr,
                          BLOCK: tl.constexpr):
    row, group = tl.program_id(0), tl.program_id(1)
    offset = tl.arange(0, BLOCK)
    k = group * GROUP + offset
    ok = (offset < GROUP) & (k < K)
    x = tl.load(x_ptr + row.to(tl.int64) * stride_xm + k, mask=ok, other=0.0).to(tl.float32)
    # An all-zero group gets a tiny scale, not 0: its quotients stay 0, never NaN.
    scale = tl.maximum(tl.max(tl.abs(x)), 1e-10) / FP8_MAX
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row.to(tl.int64) * stride_qm + k, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row * stride_sm + group, scale)


@triton.jit
def _w8a8_kernel(xq_ptr, xs_ptr, w_ptr, s_ptr, y_ptr, M, N, stride_xm, stride_xsm, stride_wn, stride_wk,
                 stride_sn, stride_sk, stride_ym, stride_yn, K: tl.constexpr, SCALE_N: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = m < M, n < N
    x_rows = xq_ptr + m[:, None].to(tl.int64) * stride_xm
    w_cols = w_ptr + n[None, :].to(tl.int64) * stride_wn
    x_scales = xs_ptr + m * stride_xsm
    w_scales = s_ptr + (n // SCALE_N) * stride_sn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):  # BLOCK_K is the weight block's K and x's quantization group: one scale each
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        a = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_cols + k[:, None] * stride_wk, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        a_scale = tl.load(x_scales + k0 // BLOCK_K, mask=m_ok, other=0.0)
        b_scale = tl.load(w_scales + (k0 // BLOCK_K) * stride_sk, mask=n_ok, other=0.0)
        acc += tl.dot(a, b) * a_scale[:, None] * b_scale[None, :]
    tl.store(y_ptr + m[:, None].to(tl.int64) * stride_ym + n[None, :] * stride_yn, acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@functools.cache
def _is_hopper(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) == (9, 0)


def _w8a8_block_fits(block: tuple[int, int]) -> bool:
    """x's quantization group is the weight block's K, one tl.dot step: a power of two fp8's tensor cores take."""
    return block[1] in (32, 64, 128, 256)


def fp8_path(x: torch.Tensor, block: tuple[int, int]) -> Fp8Path:
    """Which path `triton_fp8_block_linear(x, ...)` runs: W8A8 on Hopper for half-precision prefill-sized batches
    (W8A8_MIN_ROWS rows and more) whose block fits its K step, W8A16 everywhere else."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and rows >= W8A8_MIN_ROWS
            and _w8a8_block_fits(block) and _is_hopper(x.device.index or 0)):
        return "w8a8"
    return "w8a16"


def _check(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> None:
    if len(block) != 2 or min(block) < 1:
        raise ValueError(f"block {block}: give the weight's scale block as (rows, columns), both >= 1, e.g. (128, 128)")
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise ValueError(f"weight {weight.dtype} {tuple(weight.shape)}: the FP8 linear takes a float8_e4m3fn [N, K] "
                         "weight")
    n_features, k_features = weight.shape
    if x.shape[-1] != k_features or x.dtype not in X_DTYPES:
        raise ValueError(f"x {x.dtype} {tuple(x.shape)} @ weight {tuple(weight.shape)}^T: x needs K = {k_features} "
                         "features last, in bfloat16, float16 or float32")
    expected = (triton.cdiv(n_features, block[0]), triton.cdiv(k_features, block[1]))
    if scale_inv.dtype != torch.float32 or tuple(scale_inv.shape) != expected:
        raise ValueError(f"scale_inv {scale_inv.dtype} {tuple(scale_inv.shape)}: block {tuple(block)} over weight "
                         f"{tuple(weight.shape)} needs float32 {expected}")
    if not (x.device == weight.device == scale_inv.device):
        raise ValueError(f"x on {x.device}, weight on {weight.device}, scale_inv on {scale_inv.device}: move them to "
                         "one device")


def quantize_rows(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> float8_e4m3fn [M, K] and float32 scales [M, ceil(K / group)]: per token and per `group` columns,
    x ~= q * scale with scale = absmax / 448."""
    rows, k_features = x.shape
    x = x if x.stride(1) == 1 else x.contiguous()  # the kernel reads rows at unit stride
    q = torch.empty((rows, k_features), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty((rows, triton.cdiv(k_features, group)), dtype=torch.float32, device=x.device)
    if rows:
        _quantize_rows_kernel[(rows, scales.shape[1])](
            x, q, scales, x.stride(0), q.stride(0), scales.stride(0), K=k_features, GROUP=group,
            BLOCK=triton.next_power_of_2(group))
    return q, scales


def _w8a8(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
          out: torch.Tensor) -> None:
    if not _w8a8_block_fits(block):
        raise ValueError(f"block {tuple(block)}: the W8A8 path steps K by the block's columns, which must be 32, 64, "
                         "128 or 256; use the W8A16 path")
    rows, (n_features, k_features) = x.shape[0], weight.shape
    xq, x_scales = quantize_rows(x, block[1])
    block_m, block_n = (64, 128) if rows <= 64 else (128, 128)
    _w8a8_kernel[(triton.cdiv(rows, block_m), triton.cdiv(n_features, block_n))](
        xq, x_scales, weight, scale_inv, out, rows, n_features, xq.stride(0), x_scales.stride(0), weight.stride(0),
        weight.stride(1), scale_inv.stride(0), scale_inv.stride(1), out.stride(0), out.stride(1), K=k_features,
        SCALE_N=block[0],
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block[1], num_warps=8 if rows > 64 else 4, num_stages=3)


def _w8a16(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
           out: torch.Tensor, tile: QuantTile) -> None:
    rows, (n_features, k_features) = x.shape[0], weight.shape
    _w8a16_kernel[(triton.cdiv(rows, tile.block_m), triton.cdiv(n_features, tile.block_n))](
        x, weight, scale_inv, out, rows, n_features, x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
        scale_inv.stride(0), scale_inv.stride(1), out.stride(0), out.stride(1), K=k_features, SCALE_N=block[0],
        SCALE_K=block[1], BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
        PRECISION=precision(x.dtype), num_warps=tile.num_warps, num_stages=tile.num_stages)


def triton_fp8_block_linear(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                            path: Fp8Path | None = None, tile: QuantTile | None = None) -> torch.Tensor:
    """x [..., K] @ dequantized(weight, scale_inv)^T -> [..., N] in x's dtype. `path` overrides `fp8_path`'s choice
    and `tile` the W8A16 launch shape (tests, benchmarks)."""
    block = tuple(block)
    _check(x, weight, scale_inv, block)
    n_features, k_features = weight.shape
    flat = x.reshape(-1, k_features)
    out = flat.new_empty((flat.shape[0], n_features))
    if flat.shape[0] and n_features:
        if (path or fp8_path(x, block)) == "w8a8":
            _w8a8(flat, weight, scale_inv, block, out)
        else:
            _w8a16(flat, weight, scale_inv, block, out, tile or dequant_tile(flat.shape[0]))
    return out.view(*x.shape[:-1], n_features)
