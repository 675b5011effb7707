"""Qwen3-Next's Gated DeltaNet mixer: projections, short causal conv, the gated delta rule, gated RMSNorm, out_proj.

Projections come grouped per key head, as the checkpoint stores them: for each key head, in_proj_qkvz yields
[q | k | v for its value heads | z for its value heads] and in_proj_ba yields [b | a] for its value heads.
merge_projections() stacks the two weights so one GEMM yields both; the outputs are then used as strided views.
At batch 1 on CUDA that GEMM and out_proj are Triton GEMVs (engine/ops/linear.py: measured faster than cuBLAS there).
A decode step on CUDA in half precision runs two in-place Triton kernels (engine/ops/triton_gdn.py): the conv, which
reads q, k, v from the grouped projection, and the gated delta rule with its gates.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.layers.merge import stack_rows
from engine.layers.norm import GatedRMSNorm
from engine.layers.quantized import Linears, project
from engine.layers.step import LayerStep
from engine.ops.conv import conv_forward
from engine.ops.fused import fused
from engine.ops.gdn import decodes_in_place, gdn_decode_in_place, gdn_forward
from engine.ops.linear import linear


@fused
def gdn_gates(b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """beta = sigmoid(b) and the log-decay g = -exp(A) softplus(a + dt_bias) (float32 before exp: in half precision
    A would overflow to -inf)."""
    return b.sigmoid(), -a_log.float().exp() * F.softplus(a.float() + dt_bias)


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        self.k_heads, self.v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.k_dim, self.v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_width, self.value_width = config.linear_key_dim, config.linear_value_dim
        hidden, conv_dim = config.hidden_size, config.conv_dim
        linears = Linears(config, layer_index).scoped("linear_attn")  # nn.Linear, or quantized as the census prices
        self.in_proj_qkvz = linears("in_proj_qkvz", hidden, 2 * self.key_width + 2 * self.value_width)
        self.in_proj_ba = linears("in_proj_ba", hidden, 2 * self.v_heads)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, config.linear_conv_kernel_dim, groups=conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.v_heads))
        self.norm = GatedRMSNorm(self.v_dim, config.rms_norm_eps)
        self.out_proj = linears("out_proj", self.value_width, hidden)
        self.in_proj_merged: torch.Tensor | None = None  # set by merge_projections(): a plain tensor, not a parameter

    def merge_projections(self) -> None:
        """One GEMM for both input projections: their rows stacked, qkvz first (each keeps its per-key-head grouping);
        the parameters become views of the merged tensor. Quantized projections stay apart (layers/quantized.py)."""
        if not isinstance(self.in_proj_qkvz, nn.Linear) or not isinstance(self.in_proj_ba, nn.Linear):
            return
        self.in_proj_merged = stack_rows([self.in_proj_qkvz.weight, self.in_proj_ba.weight], self.in_proj_merged)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """qkvz [T, k_heads, 2 k_dim + 2 per_key v_dim] and ba [T, k_heads, 2 per_key], grouped per key head (views of
        one GEMM's output once merged)."""
        tokens = x.shape[0]
        if self.in_proj_merged is None:
            qkvz, ba = self.in_proj_qkvz(x), self.in_proj_ba(x)
        else:
            widths = [self.in_proj_qkvz.out_features, self.in_proj_ba.out_features]
            qkvz, ba = linear(x, self.in_proj_merged).split(widths, dim=-1)
        return qkvz.view(tokens, self.k_heads, -1), ba.view(tokens, self.k_heads, -1)

    def forward(self, x: torch.Tensor, step: LayerStep) -> torch.Tensor:
        tokens, per_key = x.shape[0], self.v_heads // self.k_heads
        qkvz, ba = self._project(x)
        conv_state, recurrent_state = step.caches.state(self.layer_index)
        # The conv's channels are q | k | v of all key heads: it reads them from the grouped projection as it comes.
        mixed = conv_forward(qkvz, self.conv1d.weight.squeeze(1), conv_state, step.ctx,
                             segments=(self.k_dim, self.k_dim, per_key * self.v_dim))
        q, k, v = mixed.split([self.key_width, self.key_width, self.value_width], dim=-1)
        # Views (reshape copies only where it must): the kernels and fla read strided inputs.
        q = q.reshape(tokens, self.k_heads, self.k_dim)
        k = k.reshape(tokens, self.k_heads, self.k_dim)
        v = v.reshape(tokens, self.v_heads, self.v_dim)
        b, a = ba.split([per_key, per_key], dim=-1)  # [T, k_heads, per_key]: head h at (h // per_key, h % per_key)
        if decodes_in_place(v, step.ctx):  # gates inside the kernel, each state slot stepped in place
            out = gdn_decode_in_place(q, k, v, b, a, self.A_log, self.dt_bias, recurrent_state, step.ctx.decode.slots)
        else:
            beta, g = gdn_gates(b.reshape(tokens, self.v_heads), a.reshape(tokens, self.v_heads), self.A_log,
                                self.dt_bias)
            out = gdn_forward(q, k, v, g, beta, recurrent_state, step.ctx)
        # z [T, k_heads, per_key, v_dim] as the projection lays it out: the norm kernel reads it without a copy.
        z = qkvz[..., 2 * self.k_dim + per_key * self.v_dim:].unflatten(-1, (per_key, self.v_dim))
        out = self.norm(out.reshape(tokens, self.v_heads, self.v_dim), z).reshape(tokens, self.value_width)
        return project(self.out_proj, out)
