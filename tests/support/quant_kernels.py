"""The quantized kernels' test cases and references (engine/ops/triton_fp8.py, triton_w4a16.py, triton_moe_quant.py):
the layouts' formulas written out in float64, independent of the engine's code, and random inputs in each layout."""

from __future__ import annotations

import torch

from engine.ops.triton_moe_quant import Fp8Experts

FP8 = torch.float8_e4m3fn


def fp8_dequantized(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The layout's formula, in float64: each weight times its (n // bn, k // bk) block's scale."""
    n_features, k_features = weight.shape
    rows = torch.arange(n_features) // block[0]
    cols = torch.arange(k_features) // block[1]
    return weight.double() * scale_inv.double().cpu()[rows][:, cols].to(weight.device)


def fp8_reference(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
                  block: tuple[int, int]) -> torch.Tensor:
    return x.double() @ fp8_dequantized(weight, scale_inv, block).T


def fp8_case(rows: int, n_features: int, k_features: int, block: tuple[int, int], seed: int,
             device: str = "cpu", dtype: torch.dtype = torch.float32):
    """x [rows, K], a float8 weight spread over fp8's range, positive scales with one per block."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, k_features, generator=g, device=device).to(dtype)
    weight = (torch.randn(n_features, k_features, generator=g, device=device) * 64).to(FP8)
    scale_inv = torch.rand(-(-n_features // block[0]), -(-k_features // block[1]), generator=g, device=device) * 1e-3
    return x, weight, scale_inv


def nibbles(words: torch.Tensor, count: int) -> torch.Tensor:
    """[..., W] int32 -> [..., count] 4-bit values, the i-th value at bits 4 (i % 8) of word i // 8."""
    i = torch.arange(count, device=words.device)
    return (words.long()[..., i // 8] >> (4 * (i % 8))) & 0xF


def w4_dequantized(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
                group_size: int) -> torch.Tensor:
    """The layout's formula, in float64: (q - z) * scale for every (n, k)."""
    n_features, k_features = qweight.shape[0], qweight.shape[1] * 8
    q = nibbles(qweight, k_features)
    groups = torch.arange(k_features, device=qweight.device) // group_size
    z = 8 if zeros is None else nibbles(zeros, n_features).T[:, groups]  # [N, K]
    return (q - z).double() * scales.double()[:, groups]


def w4_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None,
              group_size: int) -> torch.Tensor:
    return x.double() @ w4_dequantized(qweight, scales, zeros, group_size).T


def w4_case(rows: int, n_features: int, k_features: int, group_size: int, asymmetric: bool, seed: int,
            device: str = "cpu", dtype: torch.dtype = torch.float32):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, k_features, generator=g, device=device).to(dtype)
    words = dict(dtype=torch.int32, generator=g, device=device)
    qweight = torch.randint(-2**31, 2**31 - 1, (n_features, k_features // 8), **words)
    groups = k_features // group_size
    scales = (torch.rand(n_features, groups, generator=g, device=device) * 0.05).to(dtype)
    zeros = torch.randint(-2**31, 2**31 - 1, (groups, -(-n_features // 8)), **words) if asymmetric else None
    return x, qweight, scales, zeros


def dense_experts(experts) -> torch.Tensor:
    """[E, N, K] float64 by the dense layouts' formulas."""
    if isinstance(experts, Fp8Experts):
        return torch.stack([fp8_dequantized(w, s, experts.block) for w, s in zip(experts.weight, experts.scale_inv,
                                                                                  strict=True)])
    zeros = [None] * len(experts.qweight) if experts.zeros is None else experts.zeros
    return torch.stack([w4_dequantized(q, s, z, experts.group_size) for q, s, z in zip(
        experts.qweight, experts.scales, zeros, strict=True)])


def relative(ours: torch.Tensor, expected: torch.Tensor) -> float:
    return float((ours.double() - expected).norm() / expected.norm())
