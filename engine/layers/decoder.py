"""One pre-norm decoder layer in residual-stream form: the stream's sum is carried beside the sublayer output.

Eager the layer is x + mixer(norm(x)), then + mlp(norm(x)); here each `residual + sublayer output` is folded into the
next norm (RMSNorm(x, residual)), so an add and a norm are one kernel: the layer takes and returns
(hidden, residual), where the full hidden state is hidden + residual. The additions are today's, in today's order.
An MoE on its Triton path returns its weighted expert outputs unsummed, [tokens, slots, hidden]: the next norm (or the
range end, engine/models/base.py) sums them as it adds them, so `hidden` may be those parts.

The mixer keeps transformers' attribute name (`self_attn` or `linear_attn`) so parameter names match checkpoints.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelConfig
from engine.layers.moe import SparseMoE
from engine.layers.norm import RMSNorm
from engine.layers.step import LayerStep


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, mixer_name: str, mixer: nn.Module, mlp: nn.Module):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.one_centred_norm)
        self.mixer_name = mixer_name
        self.add_module(mixer_name, mixer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.one_centred_norm)
        self.mlp = mlp

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, step: LayerStep
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """`residual` None on the range's first layer (`hidden` is then the whole state). Returns (mlp output, the
        residual it adds to); the norm kernel updates the residual in place (or, folded into an MoE's router launch,
        writes a new one). `hidden` may be an MoE's parts."""
        first = residual is None
        if first:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = getattr(self, self.mixer_name)(hidden, step)
        norm = self.post_attention_layernorm
        if isinstance(self.mlp, SparseMoE) and self.mlp.folds_norm(hidden, norm):
            # Decode: the norm inside the MoE's router launch, out of place (so the first layer's is safe too).
            return self.mlp.forward_with_norm(hidden, residual, norm)
        # The first residual is the embedding output or the received activations: the caller's, never written.
        hidden, residual = norm(hidden, residual, in_place=not first)
        return self.mlp(hidden), residual
