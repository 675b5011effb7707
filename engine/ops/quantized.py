"""Matmuls over quantized weights, in the canonical layouts the engine holds (docs/architecture.md, "Quantized
weights"): the torch reference (dequantize, then one matmul) and the dispatch the layers call.

- FP8 block: weight float8_e4m3fn [N, K], scale_inv float32 [ceil(N / bn), ceil(K / bk)];
  w[n, k] = float(weight[n, k]) * scale_inv[n // bn, k // bk].
- W4A16: qweight int32 [N, K / 8], q(n, k) = (qweight[n, k // 8] >> 4 (k % 8)) & 0xF; scales [N, K / G] in the model
  dtype; zeros None (symmetric: zero point 8) or int32 [K / G, ceil(N / 8)], z(g, n) = (zeros[g, n // 8] >> 4 (n % 8))
  & 0xF; w[n, k] = (q(n, k) - z(k // G, n)) * scales[n, k // G].
y = x @ w^T in x's dtype. The reference dequantizes in float32 and rounds w to x's dtype before the matmul, as a
dequantized checkpoint of that dtype would hold it.

`fp8_block_linear` and `w4a16_linear` are the one place the fast path plugs in: on CUDA in half precision they run
the Triton kernels of engine/ops/triton_fp8.py and engine/ops/triton_w4a16.py (the weight dequantized inside the
kernel, never materialized), elsewhere the reference, so the CPU's parity tests hold the layouts' definition.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    from engine.ops.triton_fp8 import triton_fp8_block_linear
    from engine.ops.triton_w4a16 import triton_w4a16_linear
except ImportError:  # no Triton (CPU-only installs)
    triton_fp8_block_linear = triton_w4a16_linear = None

NIBBLES = 8  # 4-bit values per int32 word
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def unpack_int4(packed: torch.Tensor, count: int) -> torch.Tensor:
    """[..., W] int32 words -> [..., count] values 0..15 (value j is bits 4 (j % 8) of word j // 8)."""
    shifts = _SHIFTS.to(packed.device)
    values = (packed[..., None] >> shifts) & 0xF
    return values.flatten(-2)[..., :count]


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """[..., C] values 0..15 -> [..., ceil(C / 8)] int32 words (the inverse of unpack_int4, zero-padded)."""
    pad = -values.shape[-1] % NIBBLES
    values = F.pad(values.to(torch.int64), (0, pad)).unflatten(-1, (-1, NIBBLES))
    # The nibbles' bits are disjoint, so their OR is a sum; the word is then wrapped into int32's range.
    words = (values << _SHIFTS.to(values.device, torch.int64)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def dequantize_fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """weight [N, K] float8 with scale_inv [ceil(N / bn), ceil(K / bk)] -> w [N, K] float32."""
    rows, cols = weight.shape
    scales = scale_inv.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return weight.float() * scales


def dequantize_w4a16(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                     group_size: int) -> torch.Tensor:
    """The canonical 4-bit layout -> w [N, K] float32."""
    rows, in_features = qweight.shape[0], qweight.shape[1] * NIBBLES
    q = unpack_int4(qweight, in_features).float()
    if zeros is None:
        z = torch.full((1, 1), 8.0, device=q.device)
    else:
        z = unpack_int4(zeros, rows).t().float().repeat_interleave(group_size, 1)  # [N, K]
    return (q - z) * scales.float().repeat_interleave(group_size, 1)


def fp8_block_reference(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
                        block: tuple[int, int]) -> torch.Tensor:
    return F.linear(x, dequantize_fp8_block(weight, scale_inv, block).to(x.dtype))


def w4a16_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                    group_size: int) -> torch.Tensor:
    return F.linear(x, dequantize_w4a16(qweight, scales, zeros, group_size).to(x.dtype))


def fp8_block_linear(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
                     block: tuple[int, int]) -> torch.Tensor:
    """x [..., K] @ w^T -> [..., N] for an fp8 block-scaled weight."""
    if triton_fp8_block_linear is not None and _kernel_serves(x):
        return triton_fp8_block_linear(x, weight, scale_inv, block)
    return fp8_block_reference(x, weight, scale_inv, block)


def w4a16_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                 group_size: int) -> torch.Tensor:
    """x [..., K] @ w^T -> [..., N] for a 4-bit weight."""
    if triton_w4a16_linear is not None and _kernel_serves(x):
        return triton_w4a16_linear(x, qweight, scales, zeros, group_size)
    return w4a16_reference(x, qweight, scales, zeros, group_size)


def _kernel_serves(x: torch.Tensor) -> bool:
    """The Triton kernels serve half-precision activations on CUDA; the reference everything else."""
    return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
