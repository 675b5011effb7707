"""Jamba: Mamba (v1) layers with one attention layer per attn_layer_period, MoE FFN every expert_layer_period.

A mamba layer's per-sequence state is its depthwise conv window, d_inner x (d_conv - 1), plus the
selective-scan state, d_inner x d_state.
"""

from __future__ import annotations

import math

from solvers.census.families import adapter
from solvers.census.families.attention import (
    KV_HEADS,
    attention_layer,
    attention_linears,
    attention_params,
    head_geometry,
    require_all,
)
from solvers.census.families.common import build_census, mlp_linears, mlp_params, moe_linears, moe_params
from solvers.census.fields import ConfigFields
from solvers.census.layers import LayerCensus, LayerKind, Linear
from solvers.census.model import ModelCensus

_MAMBA_FIELDS = ("mamba_d_state", "mamba_d_conv", "mamba_expand")


def _mamba_params(fields: ConfigFields, hidden: int) -> tuple[int, list[Linear], int, int, int]:
    """(weight params, its matrices, d_inner, d_conv, d_state) of one Mamba mixer."""
    d_state, d_conv, expand = (fields.config[name] for name in _MAMBA_FIELDS)
    d_inner = expand * hidden
    dt_rank = fields.get("mamba_dt_rank", default="auto")
    dt_rank = math.ceil(hidden / 16) if dt_rank == "auto" else dt_rank
    proj_bias = bool(fields.get("mamba_proj_bias", default=False))
    conv_bias = bool(fields.get("mamba_conv_bias", default=True))
    params = (
        hidden * 2 * d_inner + proj_bias * 2 * d_inner  # in_proj (x and z)
        + d_inner * d_conv + conv_bias * d_inner  # depthwise conv1d
        + d_inner * (dt_rank + 2 * d_state)  # x_proj -> dt, B, C
        + dt_rank * d_inner + d_inner  # dt_proj, always biased
        + d_inner * d_state + d_inner  # A_log, D
        + d_inner * hidden + proj_bias * hidden  # out_proj
    )
    # Jamba normalises dt, B and C inside the mixer (the checkpoint's mamba_inner_layernorms).
    if fields.get("mamba_inner_layernorms", default=True):
        params += dt_rank + 2 * d_state
    linears = [Linear("mamba.in_proj", 2 * d_inner, hidden), Linear("mamba.x_proj", dt_rank + 2 * d_state, d_inner),
               Linear("mamba.dt_proj", d_inner, dt_rank), Linear("mamba.out_proj", hidden, d_inner)]
    return params, linears, d_inner, d_conv, d_state


@adapter("jamba")
def jamba(fields: ConfigFields) -> ModelCensus:
    num_experts = fields.get("num_experts", default=1)
    # The layer plan is read, never assumed: JambaConfig's defaults (period 8, offset 4, ...) are not
    # a published model's.
    expert_plan = ("expert_layer_period", "expert_layer_offset") if num_experts > 1 else ()
    hidden, num_layers, heads, intermediate, attn_period, attn_offset, *rest = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
        "attn_layer_period", "attn_layer_offset", *expert_plan, *_MAMBA_FIELDS, "vocab_size", *KV_HEADS,
    )
    expert_period, expert_offset = rest[:2] if expert_plan else (1, 1)
    kv_heads, head_dim = head_geometry(fields, hidden, heads)
    attention = attention_params(hidden, heads, kv_heads, head_dim)
    mamba, mamba_linears, d_inner, d_conv, d_state = _mamba_params(fields, hidden)
    norms = 2 * hidden  # input_layernorm + pre_ff_layernorm

    layers = []
    for index in range(num_layers):
        is_moe = num_experts > 1 and index % expert_period == expert_offset
        ffn = moe_params(hidden, num_experts, intermediate) if is_moe else mlp_params(hidden, intermediate)
        ffn_linears = (moe_linears(hidden, num_experts, intermediate, prefix="feed_forward", router="router")
                       if is_moe else mlp_linears(hidden, intermediate, prefix="feed_forward"))
        kind = "moe" if is_moe else "dense"
        if index % attn_period == attn_offset:
            # AI21's own code windows attention when sliding_window is set (transformers ignores it);
            # Jamba-v0.1 publishes null, i.e. full attention.
            layers.append(attention_layer(
                index, attention + ffn + norms, kv_heads=kv_heads, head_dim=head_dim,
                window=fields.get("sliding_window", default=None), ffn=kind,
                linears=attention_linears(hidden, heads, kv_heads, head_dim) + ffn_linears,
            ))
        else:
            layers.append(LayerCensus(
                index, LayerKind.MAMBA, mamba + ffn + norms,
                conv_state_elements=d_inner * (d_conv - 1), recurrent_state_elements=d_inner * d_state, ffn=kind,
                linears=tuple(mamba_linears + ffn_linears),
            ))
    return build_census(fields, layers, hidden=hidden, intermediate=intermediate)
