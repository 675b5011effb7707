"""One pre-norm decoder layer: x + mixer(norm(x)), then + mlp(norm(x)).

The mixer keeps transformers' attribute name (`self_attn` or `linear_attn`) so parameter names match checkpoints.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelConfig
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

    def forward(self, x: torch.Tensor, step: LayerStep) -> torch.Tensor:
        x = x + getattr(self, self.mixer_name)(self.input_layernorm(x), step)
        return x + self.mlp(self.post_attention_layernorm(x))
