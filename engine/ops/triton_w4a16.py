"""x @ W^T for 4-bit weights in groups along K (GPTQ/AWQ-style W4A16), dequantized inside one Triton kernel.

Layout (the loader's canonical one, whatever the checkpoint packed): qweight int32 [N, K/8] holds eight 4-bit values a
word along K, q(n, k) = (qweight[n, k // 8] >> (4 * (k % 8))) & 0xF; scales [N, K/G] in x's dtype; zeros None
(symmetric: zero point 8) or int32 [K/G, ceil(N/8)] packed along N, z(g, n) = (zeros[g, n // 8] >> (4 * (n % 8)))
& 0xF; w[n, k] = (q(n, k) - z(k // G, n)) * scales[n, k // G].
Each program dequantizes a [BLOCK_N, BLOCK_K] tile in float32 (w4_weight_rows: each word loaded once, its nibbles
split in registers; a scale and zero point a row and group where the tile's columns align with the groups, gathered
per element otherwise, so any group size that is a multiple of 8 works) and multiplies it with x
in x's dtype; the launch shapes are the FP8 kernel's (engine/ops/triton_fp8.py's dequant_tile): decode (M <= 16)
streams the weight once in narrow feature slices, a lone row as a GEMV without a tensor-core tile; prefill takes wide
tiles. Accumulation is float32; the output is cast once to x's dtype. Runs under TRITON_INTERPRET=1 on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.ops.triton_fp8 import X_DTYPES, QuantTile, dequant_tile, precision

SYMMETRIC_ZERO = tl.constexpr(8)  # the zero point of a checkpoint that stores none: 4-bit values 0..15 centred on 8


@triton.jit
def w4_weight_rows(q_ptr, s_ptr, z_ptr, n, n_ok, k0, K, stride_qn, stride_qk, stride_sn, stride_sg, stride_zg,
                   stride_zn, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """The float32 weights of rows n ([BLOCK_N]) at columns k0 .. k0 + BLOCK_K (a multiple of 8): [BLOCK_N, BLOCK_K],
    (q - z) * scale. Each int32 word is loaded once and its eight nibbles split in registers. A tile inside one group
    (GROUP a multiple of BLOCK_K) or spanning whole groups (BLOCK_K a multiple of GROUP, both powers of two) loads one
    scale and zero point a row and group; other group sizes gather them per element."""
    words_k = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    rows = n.to(tl.int64)
    words = tl.load(q_ptr + rows[:, None] * stride_qn + words_k[None, :] * stride_qk,
                    mask=n_ok[:, None] & (words_k[None, :] * 8 < K), other=0)
    shifts = tl.arange(0, 8) * 4
    # The arithmetic shift's sign bits fall outside the mask; nibble j of word i is column 8 i + j.
    q = tl.reshape((words[:, :, None] >> shifts[None, None, :]) & 0xF, (BLOCK_N, BLOCK_K))
    zero_shift = (n % 8) * 4
    if GROUP % BLOCK_K == 0:
        group = k0 // GROUP
        scale = tl.load(s_ptr + rows * stride_sn + group * stride_sg, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        if HAS_ZEROS:
            zero = (tl.load(z_ptr + group * stride_zg + (n // 8) * stride_zn, mask=n_ok, other=0)
                    >> zero_shift) & 0xF
            zero = zero[:, None]
        else:
            zero = SYMMETRIC_ZERO
        w = (q - zero).to(tl.float32) * scale
    elif BLOCK_K % GROUP == 0 and (GROUP & (GROUP - 1)) == 0:
        groups = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
        group_ok = n_ok[:, None] & (groups[None, :] * GROUP < K)
        scale = tl.load(s_ptr + rows[:, None] * stride_sn + groups[None, :] * stride_sg, mask=group_ok,
                        other=0.0).to(tl.float32)
        if HAS_ZEROS:
            zero = (tl.load(z_ptr + groups[None, :] * stride_zg + (n // 8)[:, None] * stride_zn, mask=group_ok,
                            other=0) >> zero_shift[:, None]) & 0xF
        else:
            zero = tl.full([BLOCK_N, BLOCK_K // GROUP], 8, tl.int32)
        q = tl.reshape(q, (BLOCK_N, BLOCK_K // GROUP, GROUP))
        w = tl.reshape((q - zero[:, :, None]).to(tl.float32) * scale[:, :, None], (BLOCK_N, BLOCK_K))
    else:
        k = k0 + tl.arange(0, BLOCK_K)
        group = k // GROUP
        mask = n_ok[:, None] & (k < K)[None, :]
        scale = tl.load(s_ptr + rows[:, None] * stride_sn + group[None, :] * stride_sg, mask=mask,
                        other=0.0).to(tl.float32)
        if HAS_ZEROS:
            zero = (tl.load(z_ptr + group[None, :] * stride_zg + (n // 8)[:, None] * stride_zn, mask=mask, other=0)
                    >> zero_shift[:, None]) & 0xF
        else:
            zero = SYMMETRIC_ZERO
        w = (q - zero).to(tl.float32) * scale
    return w


@triton.jit
def _w4a16_kernel(x_ptr, q_ptr, s_ptr, z_ptr, y_ptr, M, N, stride_xm, stride_xk, stride_qn, stride_qk, stride_sn,
                  stride_sg, stride_zg, stride_zn, stride_ym, stride_yn, K: tl.constexpr, GROUP: tl.constexpr,
                  HAS_ZEROS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  PRECISION: tl.constexpr):
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
        w = w4_weight_rows(q_ptr, s_ptr, z_ptr, n, n_ok, k0, K, stride_qn, stride_qk, stride_sn, stride_sg,
                           stride_zg, stride_zn, GROUP, HAS_ZEROS, BLOCK_N, BLOCK_K)
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


def _check(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
           group_size: int) -> None:
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise ValueError(f"qweight {qweight.dtype} {tuple(qweight.shape)}: W4A16 takes int32 [N, K/8], eight 4-bit "
                         "values a word along K")
    n_features, k_features = qweight.shape[0], qweight.shape[1] * 8
    if x.shape[-1] != k_features or x.dtype not in X_DTYPES:
        raise ValueError(f"x {x.dtype} {tuple(x.shape)} @ qweight {tuple(qweight.shape)}: x needs K = {k_features} "
                         "features last (8 a qweight word), in bfloat16, float16 or float32")
    if group_size < 8 or group_size % 8 or k_features % group_size:
        raise ValueError(f"group_size {group_size} with K = {k_features}: the group size must be a multiple of 8 "
                         "that divides K (128 is common)")
    groups = k_features // group_size
    if scales.dtype != x.dtype or tuple(scales.shape) != (n_features, groups):
        raise ValueError(f"scales {scales.dtype} {tuple(scales.shape)}: need {x.dtype} [N, K/G] = "
                         f"{(n_features, groups)}")
    packed_n = triton.cdiv(n_features, 8)
    if zeros is not None and (zeros.dtype != torch.int32 or tuple(zeros.shape) != (groups, packed_n)):
        raise ValueError(f"zeros {zeros.dtype} {tuple(zeros.shape)}: need int32 [K/G, ceil(N/8)] = "
                         f"{(groups, packed_n)}, eight 4-bit zero points a word along N (or None: symmetric, 8)")
    tensors = (x, qweight, scales) if zeros is None else (x, qweight, scales, zeros)
    if len({t.device for t in tensors}) != 1:
        raise ValueError(f"x, qweight, scales{', zeros' if zeros is not None else ''} on "
                         f"{', '.join(str(t.device) for t in tensors)}: move them to one device")


def triton_w4a16_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                        group_size: int, tile: QuantTile | None = None) -> torch.Tensor:
    """x [..., K] @ dequantized(qweight, scales, zeros)^T -> [..., N] in x's dtype. `tile` overrides the launch
    shape (tests, benchmarks)."""
    _check(x, qweight, scales, zeros, group_size)
    n_features, k_features = qweight.shape[0], qweight.shape[1] * 8
    flat = x.reshape(-1, k_features)
    rows = flat.shape[0]
    out = flat.new_empty((rows, n_features))
    if rows and n_features:
        tile = tile or dequant_tile(rows)
        zero_strides = (0, 0) if zeros is None else zeros.stride()
        _w4a16_kernel[(triton.cdiv(rows, tile.block_m), triton.cdiv(n_features, tile.block_n))](
            flat, qweight, scales, qweight if zeros is None else zeros, out, rows, n_features, flat.stride(0),
            flat.stride(1), qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1), *zero_strides,
            out.stride(0), out.stride(1), K=k_features, GROUP=group_size, HAS_ZEROS=zeros is not None,
            BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, PRECISION=precision(x.dtype),
            num_warps=tile.num_warps, num_stages=tile.num_stages)
    return out.view(*x.shape[:-1], n_features)
