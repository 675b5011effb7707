"""RMSNorm in its three forms: Llama's (w x), Qwen3-Next's one-centred ((1 + w) x) and the gated form of GDN.

The float32 round trip and where the cast back to the input dtype happens follow each reference exactly,
because in bf16 those placements change the result.

RMSNorm also takes the residual stream: norm(x, residual) adds x into the residual first (the pre-norm layer's
`residual + sublayer(...)`) and returns both, so the add and the norm are one kernel. On CUDA in half precision that
kernel is Triton's (engine/ops/triton_norm.py) and the residual is updated in place; elsewhere the eager code below
runs (compiled on CUDA by @fused), computing the same sum and norm out of place. What is added may come as parts
[..., P, width] (the MoE's weighted expert outputs on its Triton path, engine/layers/moe.py): both forms sum them in
float32, round the sum once to the dtype and add that to the residual (`sum_parts`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.ops import HALF
from engine.ops.fused import fused

try:
    from engine.ops.triton_norm import triton_gated_rms_norm, triton_rms_norm
except ImportError:  # no Triton (CPU-only installs): the eager code serves every device
    triton_rms_norm = triton_gated_rms_norm = None



def _normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _scaled(x: torch.Tensor, weight: torch.Tensor, eps: float, one_centred: bool) -> torch.Tensor:
    normed = _normalise(x, eps)
    if one_centred:
        # Qwen3-Next multiplies in float32 and casts last.
        return (normed * (1.0 + weight.float())).type_as(x)
    # Llama casts back first, then multiplies by the weight.
    return weight * normed.to(x.dtype)


@fused
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, one_centred: bool) -> torch.Tensor:
    return _scaled(x, weight, eps, one_centred)


def sum_parts(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """What x adds to `residual` [..., width]: x itself, or for parts [..., P, width] their sum, taken in float32 and
    rounded once to x's dtype."""
    return x.float().sum(-2).to(x.dtype) if x.dim() == residual.dim() + 1 else x


@fused
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, one_centred: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + x), residual + x): the sum is rounded to the dtype before the norm reads it, as eager.
    x may be parts [..., P, width] (see sum_parts)."""
    summed = residual + sum_parts(x, residual)
    return _scaled(summed, weight, eps, one_centred), summed


@fused
def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    normed = weight * _normalise(x, eps).to(x.dtype)
    return (normed * F.silu(gate.float())).to(x.dtype)


def _kernel_serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The Triton kernels take CUDA half-precision inputs with a weight of the same dtype (float32 is the reference)."""
    return triton_rms_norm is not None and x.is_cuda and x.dtype in HALF and weight.dtype == x.dtype


class RMSNorm(nn.Module):
    """`one_centred=True` stores w around 0 and scales by (1 + w) (Qwen3-Next), else scales by w."""

    def __init__(self, dim: int, eps: float, one_centred: bool = False):
        super().__init__()
        self.eps = eps
        self.one_centred = one_centred
        self.weight = nn.Parameter(torch.zeros(dim) if one_centred else torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, in_place: bool = True
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x); with `residual`, (norm(residual + x), residual + x), where x may be parts [..., P, width] of what
        is added (summed first, see sum_parts). `in_place=False` keeps `residual` intact (the kernel writes the sum to
        a new tensor): for a residual that is someone else's tensor."""
        if residual is None:
            if _kernel_serves(x, self.weight):
                return triton_rms_norm(x, self.weight, self.eps, self.one_centred)
            return rms_norm(x, self.weight, self.eps, self.one_centred)
        if _kernel_serves(x, self.weight):
            summed = residual if in_place else torch.empty_like(residual, memory_format=torch.contiguous_format)
            return triton_rms_norm(x, self.weight, self.eps, self.one_centred, residual, summed), summed
        return add_rms_norm(x, residual, self.weight, self.eps, self.one_centred)


class GatedRMSNorm(nn.Module):
    """GDN's output norm: normalise, scale by w, then multiply by silu(gate) (norm before gate)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x [..., heads, width]; gate of x's shape, or grouped [..., groups, per_group, width] (see
        engine/ops/triton_norm.py::triton_gated_rms_norm: the kernel reads it in place, the eager path copies it)."""
        if _kernel_serves(x, self.weight):
            return triton_gated_rms_norm(x, gate, self.weight, self.eps)
        return gated_rms_norm(x, gate.reshape(x.shape), self.weight, self.eps)
