"""RMSNorm in its three forms: Llama's (w x), Qwen3-Next's one-centred ((1 + w) x) and the gated form of GDN.

The float32 round trip and where the cast back to the input dtype happens follow each reference exactly,
because in bf16 those placements change the result.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.fused import fused


def _normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@fused
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, one_centred: bool) -> torch.Tensor:
    normed = _normalise(x, eps)
    if one_centred:
        # Qwen3-Next multiplies in float32 and casts last.
        return (normed * (1.0 + weight.float())).type_as(x)
    # Llama casts back first, then multiplies by the weight.
    return weight * normed.to(x.dtype)


@fused
def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    normed = weight * _normalise(x, eps).to(x.dtype)
    return (normed * F.silu(gate.float())).to(x.dtype)


class RMSNorm(nn.Module):
    """`one_centred=True` stores w around 0 and scales by (1 + w) (Qwen3-Next), else scales by w."""

    def __init__(self, dim: int, eps: float, one_centred: bool = False):
        super().__init__()
        self.eps = eps
        self.one_centred = one_centred
        self.weight = nn.Parameter(torch.zeros(dim) if one_centred else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.one_centred)


class GatedRMSNorm(nn.Module):
    """GDN's output norm: normalise, scale by w, then multiply by silu(gate) (norm before gate)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps)
