"""Qwen2-MoE (Qwen1.5-MoE) and Qwen3-MoE: Qwen attention with a sparse FFN on every decoder_sparse_step-th layer.

Qwen2-MoE adds a shared expert behind a sigmoid gate; Qwen3-MoE has none.
"""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import attention_layer, head_geometry, sliding_window
from solvers.census.families.common import build_census, mlp_params, moe_params
from solvers.census.families.qwen import qwen_attention_params, qwen_layer_types
from solvers.census.fields import ConfigFields
from solvers.census.model import ModelCensus


@adapter("qwen2_moe", "qwen3_moe")
def qwen_moe(fields: ConfigFields) -> ModelCensus:
    hidden, num_layers, heads, num_experts, expert_intermediate = fields.require(
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_experts", "moe_intermediate_size"
    )
    kv_heads, head_dim = head_geometry(fields, hidden, heads)
    attention = qwen_attention_params(fields, hidden, heads, kv_heads, head_dim)
    shared = fields.get("shared_expert_intermediate_size") if fields.family == "qwen2_moe" else 0
    sparse_step = fields.get("decoder_sparse_step", default=1)
    mlp_only = set(fields.get("mlp_only_layers", default=[]))
    layer_types = qwen_layer_types(fields, num_layers)
    window = sliding_window(fields, layer_types)

    moe = moe_params(hidden, num_experts, expert_intermediate, shared_intermediate=shared, shared_gate=bool(shared))
    dense_intermediate = None
    layers = []
    for index, layer_type in enumerate(layer_types):
        is_moe = num_experts > 0 and index not in mlp_only and (index + 1) % sparse_step == 0
        if is_moe:
            ffn = moe
        else:
            # Only layers left dense need intermediate_size, so only they demand it.
            dense_intermediate = dense_intermediate or fields.get("intermediate_size")
            ffn = mlp_params(hidden, dense_intermediate)
        layers.append(attention_layer(
            index, attention + ffn + 2 * hidden, kv_heads=kv_heads, head_dim=head_dim,
            window=window if layer_type == "sliding_attention" else None, ffn="moe" if is_moe else "dense",
        ))
    intermediate = max(fields.get("intermediate_size", default=0), expert_intermediate, shared)
    return build_census(fields, layers, hidden=hidden, intermediate=intermediate)
