"""Qwen2-MoE (Qwen1.5-MoE) and Qwen3-MoE: Qwen attention with a sparse FFN on every decoder_sparse_step-th layer.

Qwen2-MoE adds a shared expert behind a sigmoid gate; Qwen3-MoE has none.
"""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import (
    attention_layer,
    attention_linears,
    head_geometry,
    require_all,
    sliding_window,
)
from solvers.census.families.common import build_census, mlp_linears, mlp_params, moe_linears, moe_params
from solvers.census.families.qwen import qwen_attention_params, qwen_head_fields, qwen_layer_types
from solvers.census.fields import ConfigFields
from solvers.census.model import ModelCensus


@adapter("qwen2_moe", "qwen3_moe")
def qwen_moe(fields: ConfigFields) -> ModelCensus:
    sparse_step = fields.get("decoder_sparse_step", default=1)
    mlp_only = set(fields.get("mlp_only_layers", default=[]))
    # Layers left dense (mlp_only_layers, off-step layers, or no experts) are sized by intermediate_size.
    has_dense = bool(mlp_only) or sparse_step > 1 or not fields.get("num_experts", default=0)
    hidden, num_layers, heads, num_experts, expert_intermediate, *_ = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", "num_experts", "moe_intermediate_size",
        "vocab_size", *(("shared_expert_intermediate_size",) if fields.family == "qwen2_moe" else ()),
        *(("intermediate_size",) if has_dense else ()), *qwen_head_fields(fields),
    )
    kv_heads, head_dim = head_geometry(fields, hidden, heads)
    attention = qwen_attention_params(fields, hidden, heads, kv_heads, head_dim)
    shared = fields.config["shared_expert_intermediate_size"] if fields.family == "qwen2_moe" else 0
    dense = mlp_params(hidden, fields.config["intermediate_size"]) if has_dense else 0
    layer_types = qwen_layer_types(fields, num_layers)
    window = sliding_window(fields, layer_types)

    moe = moe_params(hidden, num_experts, expert_intermediate, shared_intermediate=shared, shared_gate=bool(shared))
    attention_matrices = attention_linears(hidden, heads, kv_heads, head_dim)
    moe_matrices = moe_linears(hidden, num_experts, expert_intermediate, shared_intermediate=shared,
                               shared_gate=bool(shared))
    dense_matrices = mlp_linears(hidden, fields.config["intermediate_size"]) if has_dense else []
    layers = []
    for index, layer_type in enumerate(layer_types):
        is_moe = num_experts > 0 and index not in mlp_only and (index + 1) % sparse_step == 0
        layers.append(attention_layer(
            index, attention + (moe if is_moe else dense) + 2 * hidden, kv_heads=kv_heads, head_dim=head_dim,
            window=window if layer_type == "sliding_attention" else None, ffn="moe" if is_moe else "dense",
            linears=attention_matrices + (moe_matrices if is_moe else dense_matrices),
        ))
    intermediate = max(fields.get("intermediate_size", default=0), expert_intermediate, shared)
    return build_census(fields, layers, hidden=hidden, intermediate=intermediate)
