"""The gated SiLU MLP: down(silu(gate(x)) * up(x)).

`merge_projections()` stacks gate_proj and up_proj (rows, and biases when present) into one [2I, H] tensor, so the
step runs one GEMM for both and splits it: the same values as the two GEMMs, one kernel fewer (engine/layers/merge.py).
An MoE's shared expert may have had its rows stacked already, as one more expert of the routed experts' tensors
(engine/layers/moe.py): its merged tensor is then a view of that expert, and merging again keeps it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.merge import stack_rows
from engine.layers.quantized import Linears
from engine.ops.fused import fused


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, linears: Linears | None = None):
        """`linears` (scoped to this MLP's census name) makes the projections a quantized checkpoint converts."""
        super().__init__()
        make = linears or (lambda _, in_features, out_features, bias: nn.Linear(in_features, out_features, bias))
        self.gate_proj = make("gate_proj", hidden_size, intermediate_size, bias)
        self.up_proj = make("up_proj", hidden_size, intermediate_size, bias)
        self.down_proj = make("down_proj", intermediate_size, hidden_size, bias)
        # Plain attributes (not parameters): the parameters stay the checkpoint's, as views of these rows.
        self.gate_up_weight: torch.Tensor | None = None
        self.gate_up_bias: torch.Tensor | None = None

    def merge_projections(self) -> None:
        if not isinstance(self.gate_proj, nn.Linear) or not isinstance(self.up_proj, nn.Linear):
            return  # quantized projections stay apart (engine/layers/quantized.py)
        self.gate_up_weight = stack_rows([self.gate_proj.weight, self.up_proj.weight], self.gate_up_weight)
        if self.gate_proj.bias is not None:
            self.gate_up_bias = stack_rows([self.gate_proj.bias, self.up_proj.bias], self.gate_up_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_weight is not None:
            return self.down_proj(silu_mul(F.linear(x, self.gate_up_weight, self.gate_up_bias)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@fused
def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2I] (gate columns first) -> silu(gate) * up [..., I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
