"""Qwen3-Next's Gated DeltaNet mixer: projections, short causal conv, the gated delta rule, gated RMSNorm, out_proj.

Projections come grouped per key head, as the checkpoint stores them: for each key head, in_proj_qkvz yields
[q | k | v for its value heads | z for its value heads] and in_proj_ba yields [b | a] for its value heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.fused import fused
from engine.layers.norm import GatedRMSNorm
from engine.layers.step import LayerStep
from engine.ops.conv import conv_forward
from engine.ops.gdn import gdn_forward


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
        self.in_proj_qkvz = nn.Linear(hidden, 2 * self.key_width + 2 * self.value_width, bias=False)
        self.in_proj_ba = nn.Linear(hidden, 2 * self.v_heads, bias=False)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, config.linear_conv_kernel_dim, groups=conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.v_heads))
        self.norm = GatedRMSNorm(self.v_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_width, hidden, bias=False)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Ungroup the per-key-head projections.

        Returns q, k [T, k_heads, k_dim]; v, z [T, v_heads, v_dim]; b, a [T, v_heads].
        """
        tokens, per_key = x.shape[0], self.v_heads // self.k_heads
        qkvz = self.in_proj_qkvz(x).view(tokens, self.k_heads, -1)
        q, k, v, z = qkvz.split([self.k_dim, self.k_dim, per_key * self.v_dim, per_key * self.v_dim], dim=-1)
        b, a = self.in_proj_ba(x).view(tokens, self.k_heads, -1).split([per_key, per_key], dim=-1)
        v, z = v.reshape(tokens, self.v_heads, self.v_dim), z.reshape(tokens, self.v_heads, self.v_dim)
        return q, k, v, z, b.reshape(tokens, self.v_heads), a.reshape(tokens, self.v_heads)

    def forward(self, x: torch.Tensor, step: LayerStep) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v, z, b, a = self._split(x)
        conv_state, recurrent_state = step.caches.state(self.layer_index)
        mixed = torch.cat((q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1)), dim=-1)
        mixed = conv_forward(mixed, self.conv1d.weight.squeeze(1), conv_state, step.ctx)
        q, k, v = mixed.split([self.key_width, self.key_width, self.value_width], dim=-1)
        q = q.reshape(tokens, self.k_heads, self.k_dim)
        k = k.reshape(tokens, self.k_heads, self.k_dim)
        v = v.reshape(tokens, self.v_heads, self.v_dim)
        beta, g = gdn_gates(b, a, self.A_log, self.dt_bias)
        out = gdn_forward(q, k, v, g, beta, recurrent_state, step.ctx)
        out = self.norm(out.reshape(-1, self.v_dim), z.reshape(-1, self.v_dim)).reshape(tokens, self.value_width)
        return self.out_proj(out)
