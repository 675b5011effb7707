"""Qwen3-Next: Gated DeltaNet linear attention, gated full attention one layer in N, MoE FFN."""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import attention_linears
from solvers.census.families.common import build_census, mlp_linears, mlp_params, moe_linears, moe_params
from solvers.census.fields import ConfigFields
from solvers.census.layers import LayerCensus, LayerKind, Linear
from solvers.census.model import ModelCensus


def _layer_types(fields: ConfigFields, num_layers: int) -> list[str]:
    declared = fields.get("layer_types", default=None)
    if declared is not None:
        if len(declared) != num_layers:
            raise fields.missing(f"layer_types with {num_layers} entries (it has {len(declared)})")
        return list(declared)
    interval = fields.get("full_attention_interval")
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]


@adapter("qwen3_next")
def qwen3_next(fields: ConfigFields) -> ModelCensus:
    hidden, num_layers, heads, kv_heads = fields.require(
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"
    )
    head_dim = fields.get("head_dim", default=hidden // heads)
    k_heads, v_heads, k_dim, v_dim, kernel = fields.require(
        "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
        "linear_value_head_dim", "linear_conv_kernel_dim",
    )
    bias = int(bool(fields.get("attention_bias", default=False)))
    norms = 2 * hidden  # input_layernorm + post_attention_layernorm

    # Full attention: q_proj carries the output gate, hence 2x; q_norm and k_norm per head_dim.
    full_attention = (
        hidden * heads * head_dim * 2 + bias * heads * head_dim * 2
        + 2 * (hidden * kv_heads * head_dim + bias * kv_heads * head_dim)
        + heads * head_dim * hidden + bias * hidden
        + 2 * head_dim
    )
    key_dim, value_dim = k_heads * k_dim, v_heads * v_dim
    conv_channels = 2 * key_dim + value_dim
    linear_attention = (
        hidden * (2 * key_dim + 2 * value_dim)  # in_proj_qkvz
        + hidden * 2 * v_heads  # in_proj_ba
        + conv_channels * kernel  # depthwise conv, no bias
        + 2 * v_heads  # dt_bias, A_log
        + v_dim  # gated RMSNorm
        + value_dim * hidden  # out_proj
    )
    full_linears = attention_linears(hidden, heads, kv_heads, head_dim, q_gate=True)
    linear_linears = [Linear("linear_attn.in_proj_qkvz", 2 * key_dim + 2 * value_dim, hidden),
                      Linear("linear_attn.in_proj_ba", 2 * v_heads, hidden),
                      Linear("linear_attn.out_proj", hidden, value_dim)]

    num_experts = fields.get("num_experts", default=0)
    sparse_step = fields.get("decoder_sparse_step", default=1)
    mlp_only = set(fields.get("mlp_only_layers", default=[]))
    layers = []
    for index, layer_type in enumerate(_layer_types(fields, num_layers)):
        is_moe = num_experts > 0 and index not in mlp_only and (index + 1) % sparse_step == 0
        if is_moe:
            expert = fields.get("moe_intermediate_size")
            shared = fields.get("shared_expert_intermediate_size", default=0)
            ffn = moe_params(hidden, num_experts, expert, shared_intermediate=shared, shared_gate=True)
            ffn_linears = moe_linears(hidden, num_experts, expert, shared_intermediate=shared, shared_gate=True)
        else:
            ffn = mlp_params(hidden, fields.get("intermediate_size"))
            ffn_linears = mlp_linears(hidden, fields.get("intermediate_size"))
        if layer_type == "full_attention":
            layers.append(LayerCensus(
                index, LayerKind.FULL_ATTENTION, full_attention + ffn + norms,
                kv_elements_per_token=2 * kv_heads * head_dim, ffn="moe" if is_moe else "dense",
                linears=tuple(full_linears + ffn_linears),
            ))
        elif layer_type == "linear_attention":
            layers.append(LayerCensus(
                index, LayerKind.LINEAR_ATTENTION, linear_attention + ffn + norms,
                conv_state_elements=conv_channels * (kernel - 1),
                recurrent_state_elements=v_heads * k_dim * v_dim,
                ffn="moe" if is_moe else "dense", linears=tuple(linear_linears + ffn_linears),
            ))
        else:
            raise fields.missing(f"a known layer type at layer {index} (got {layer_type!r})")
    intermediate = max(fields.get("intermediate_size", default=0), fields.get("moe_intermediate_size", default=0))
    return build_census(fields, layers, hidden=hidden, intermediate=intermediate)
