"""The dense family: Llama and Mistral, Qwen2 (q/k/v bias) and Qwen3 (q/k norm); differences live in ModelConfig."""

from __future__ import annotations

from torch import nn

from engine.layers.attention import Attention
from engine.layers.decoder import DecoderLayer
from engine.layers.mlp import GatedMLP
from engine.layers.quantized import Linears
from engine.models.base import RangeCausalLM


class LlamaModel(RangeCausalLM):
    def make_layer(self, index: int) -> nn.Module:
        config = self.config
        mlp = GatedMLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias,
                       linears=Linears(config, index).scoped("mlp"))
        return DecoderLayer(config, "self_attn", Attention(config, index), mlp)
