"""Qwen3-Next: Gated DeltaNet layers with gated full attention every few layers; MoE (or dense) FFN.

Which layer is which comes from the census (ModelConfig.layer_kind), never from the config directly.
"""

from __future__ import annotations

from torch import nn

from engine.layers.attention import Attention
from engine.layers.decoder import DecoderLayer
from engine.layers.gated_deltanet import GatedDeltaNet
from engine.layers.mlp import GatedMLP
from engine.layers.moe import SparseMoE
from engine.layers.quantized import Linears
from engine.models.base import RangeCausalLM
from solvers.census import LayerKind


class Qwen3NextModel(RangeCausalLM):
    def make_layer(self, index: int) -> nn.Module:
        config = self.config
        if config.layer_kind(index) == LayerKind.LINEAR_ATTENTION:
            mixer_name, mixer = "linear_attn", GatedDeltaNet(config, index)
        else:
            mixer_name, mixer = "self_attn", Attention(config, index)
        linears = Linears(config, index).scoped("mlp")  # nn.Linear, or quantized as the census prices
        if config.is_moe_layer(index):
            mlp = SparseMoE(
                config.hidden_size, config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
                config.norm_topk_prob, config.shared_expert_intermediate_size, linears,
            )
        else:
            mlp = GatedMLP(config.hidden_size, config.intermediate_size, linears=linears)
        return DecoderLayer(config, mixer_name, mixer, mlp)
