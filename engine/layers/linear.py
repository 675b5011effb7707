"""A linear layer's projection: F.linear, or on CUDA in half precision at decode-sized batches the Triton GEMV.

At 1..MAX_ROWS rows a projection is a GEMV bound by reading its weight; cuBLAS leaves most SMs idle on the narrow
ones (out_proj, o_proj), engine/ops/triton_gemv.py keeps them all streaming. The choice is by shape only (no sync),
and the CPU, float32 and larger batches keep F.linear exactly as before.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

try:
    from engine.ops.triton_gemv import MAX_ROWS, gemv
except ImportError:  # no Triton (CPU-only installs): F.linear serves every device
    gemv, MAX_ROWS = None, 0

HALF = (torch.bfloat16, torch.float16)


def _gemv_serves(layer: nn.Linear, x: torch.Tensor) -> bool:
    """By shapes and dtypes only: a captured CUDA graph takes the same path at every replay."""
    rows = math.prod(x.shape[:-1])
    return (gemv is not None and x.is_cuda and x.dtype in HALF and layer.weight.dtype == x.dtype
            and layer.weight.stride(-1) == 1 and 0 < rows <= MAX_ROWS)


def project(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """layer(x) over x's last dim, any leading dims."""
    if not _gemv_serves(layer, x):
        return F.linear(x, layer.weight, layer.bias)
    out = gemv(x.reshape(-1, x.shape[-1]), layer.weight, layer.bias)
    return out.view(*x.shape[:-1], out.shape[-1])
