"""Qwen2 / Qwen2.5 and Qwen3 dense: GQA attention (qkv bias on Qwen2, q/k norms on Qwen3), gated MLP."""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import (
    KV_HEADS,
    attention_layer,
    attention_linears,
    attention_params,
    declared_layer_types,
    head_geometry,
    require_all,
    sliding_window,
)
from solvers.census.families.common import build_census, mlp_linears, mlp_params
from solvers.census.fields import ConfigFields
from solvers.census.model import ModelCensus


def qwen_layer_types(fields: ConfigFields, num_layers: int) -> list[str]:
    """Which layers slide. Each Qwen generation words the rule differently (as transformers reads it):
    Qwen2/Qwen3 slide layers at or above max_window_layers, Qwen2-MoE the even layers below it,
    Qwen3-MoE every layer; all only when use_sliding_window is set. An explicit layer_types wins.
    """
    declared = declared_layer_types(fields, num_layers)
    if declared is not None:
        return declared
    if not fields.get("use_sliding_window", default=False) or not fields.get("sliding_window", default=None):
        return ["full_attention"] * num_layers
    family = fields.family
    if family == "qwen3_moe":
        return ["sliding_attention"] * num_layers
    max_window_layers = fields.get("max_window_layers", default=28)
    if family == "qwen2_moe":
        slides = [index % 2 == 0 and index < max_window_layers for index in range(num_layers)]
    else:
        slides = [index >= max_window_layers for index in range(num_layers)]
    return ["sliding_attention" if slide else "full_attention" for slide in slides]


def qwen_head_fields(fields: ConfigFields) -> tuple[str, ...]:
    """Qwen3 configs always state head_dim (it is not hidden_size / heads: 128 on Qwen3-8B's 4096 / 32
    happens to agree, Qwen3-30B-A3B's 2048 / 32 does not)."""
    return (*KV_HEADS, *(("head_dim",) if fields.family.startswith("qwen3") else ()))


def qwen_attention_params(fields: ConfigFields, hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Qwen2-family q/k/v carry a bias (o does not); Qwen3-family use attention_bias on all four plus q/k norms."""
    if fields.family.startswith("qwen2"):
        bias = bool(fields.get("qkv_bias", default=True))
        return attention_params(hidden, heads, kv_heads, head_dim, qkv_bias=bias)
    bias = bool(fields.get("attention_bias", default=False))
    return attention_params(hidden, heads, kv_heads, head_dim, qkv_bias=bias, o_bias=bias, qk_norm=True)


@adapter("qwen2", "qwen3")
def qwen(fields: ConfigFields) -> ModelCensus:
    hidden, num_layers, heads, intermediate, *_ = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
        *qwen_head_fields(fields),
    )
    kv_heads, head_dim = head_geometry(fields, hidden, heads)
    per_layer = qwen_attention_params(fields, hidden, heads, kv_heads, head_dim) + mlp_params(hidden, intermediate)
    per_layer += 2 * hidden  # input_layernorm + post_attention_layernorm
    linears = attention_linears(hidden, heads, kv_heads, head_dim) + mlp_linears(hidden, intermediate)
    layer_types = qwen_layer_types(fields, num_layers)
    window = sliding_window(fields, layer_types)
    layers = [
        attention_layer(
            index, per_layer, kv_heads=kv_heads, head_dim=head_dim,
            window=window if layer_type == "sliding_attention" else None, linears=linears,
        )
        for index, layer_type in enumerate(layer_types)
    ]
    return build_census(fields, layers, hidden=hidden, intermediate=intermediate)
