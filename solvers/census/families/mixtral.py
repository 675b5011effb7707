"""Mixtral: Mistral attention with a sparse MoE FFN (router + gated experts) on every layer."""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import (
    KV_HEADS,
    attention_layer,
    attention_linears,
    attention_params,
    head_geometry,
    require_all,
)
from solvers.census.families.common import build_census, moe_linears, moe_params
from solvers.census.fields import ConfigFields
from solvers.census.model import ModelCensus


@adapter("mixtral")
def mixtral(fields: ConfigFields) -> ModelCensus:
    hidden, num_layers, heads, intermediate, num_experts, *_ = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
        "num_local_experts", "vocab_size", *KV_HEADS,
    )
    kv_heads, head_dim = head_geometry(fields, hidden, heads)
    # No projection biases; each expert is a gated MLP of intermediate_size; router has no bias.
    per_layer = attention_params(hidden, heads, kv_heads, head_dim) + moe_params(hidden, num_experts, intermediate)
    per_layer += 2 * hidden  # input_layernorm + post_attention_layernorm
    # MixtralConfig defaults sliding_window to None, so an absent key means full attention.
    window = fields.get("sliding_window", default=None)
    linears = attention_linears(hidden, heads, kv_heads, head_dim) + moe_linears(hidden, num_experts, intermediate)
    layers = [
        attention_layer(index, per_layer, kv_heads=kv_heads, head_dim=head_dim, window=window, ffn="moe",
                        linears=linears)
        for index in range(num_layers)
    ]
    return build_census(fields, layers, hidden=hidden, intermediate=intermediate)
