"""The projections' matmul: a Triton GEMV for a batch-1 decode step on CUDA, F.linear otherwise.

Which projections take it is measured, not assumed (benchmarks/decode_tiles.py on the H200, weights read from HBM):
the GEMV beat cuBLAS at batch 1 for every decode projection of the bench model (GDN's in_proj and out_proj,
attention's qkv and o_proj), so the layers call `linear` for each.
Everywhere else (CPU, float32, a bias, more than one row) F.linear runs, so the CPU reference and its parity tests are
unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.ops import HALF

try:
    from engine.ops.triton_gemv import triton_gemv
except ImportError:  # no Triton (CPU-only installs)
    triton_gemv = None



def gemv_serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear(x, weight)` runs the Triton GEMV: CUDA, half precision, one row."""
    return (triton_gemv is not None and x.is_cuda and x.dim() == 2 and x.shape[0] == 1 and x.dtype in HALF
            and weight.dtype == x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight^T (+ bias), as F.linear."""
    if bias is None and gemv_serves(x, weight):
        return triton_gemv(x, weight)
    return F.linear(x, weight, bias)
