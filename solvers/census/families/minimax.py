"""MiniMax-Text-01 / MiniMax-M1 (minimax, and the remote-code minimax_text_01 / minimax_m1): lightning-attention
linear layers and softmax GQA layers, named by `layer_types` (linear_attention / full_attention) or the remote
code's `attn_type_list` (0 lightning, 1 softmax); a MoE (softmax router, no bias) on every layer.

A lightning layer keeps per sequence one K^T V state of head_dim x head_dim per head, and no conv window; a softmax
layer caches 2 x kv_heads x head_dim per token. A shared expert (shared_intermediate_size > 0, remote code only)
is refused: no published checkpoint has one.
"""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import (
    KV_HEADS,
    attention_layer,
    attention_linears,
    attention_params,
    require_all,
)
from solvers.census.families.common import build_census, mlp_linears, mlp_params
from solvers.census.fields import ConfigFields
from solvers.census.layers import LayerCensus, LayerKind, Linear
from solvers.census.model import ModelCensus

_ATTN_TYPES = {0: "linear_attention", 1: "full_attention"}


def _layer_types(fields: ConfigFields, num_layers: int) -> list[str]:
    # MiniMaxConfig alternates without a list; the published models do not, so a list is demanded.
    declared = [_ATTN_TYPES.get(kind, kind) if isinstance(kind, int) else kind
                for kind in fields.get("layer_types", "attn_type_list")]
    if len(declared) != num_layers:
        raise fields.missing(f"layer_types with {num_layers} entries (it has {len(declared)})")
    unknown = sorted({str(kind) for kind in declared if kind not in _ATTN_TYPES.values()})
    if unknown:
        raise fields.missing(f"layer_types of linear_attention or full_attention (got {', '.join(unknown)})")
    return list(declared)


@adapter("minimax", "minimax_text_01", "minimax_m1")
def minimax(fields: ConfigFields) -> ModelCensus:
    hidden, num_layers, heads, expert, experts, *_ = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "num_local_experts",
        "vocab_size", *KV_HEADS,
    )
    if fields.get("shared_intermediate_size", default=0):
        raise fields.missing("shared_intermediate_size of 0 (a shared expert's layout is not known to the census)")
    kv_heads = fields.config["num_key_value_heads"]
    head_dim = fields.get("head_dim", default=hidden // heads)
    width = heads * head_dim
    lightning_linears = [Linear("self_attn.qkv_proj", 3 * width, hidden),
                         Linear("self_attn.output_gate", width, hidden), Linear("self_attn.out_proj", hidden, width)]
    lightning = sum(linear.params for linear in lightning_linears) + width  # + its RMSNorm
    softmax = attention_params(hidden, heads, kv_heads, head_dim)
    moe = experts * hidden + experts * mlp_params(hidden, expert)  # router (no bias) + experts
    moe_linears = [Linear("mlp.gate", experts, hidden, gate=True),
                   *mlp_linears(hidden, expert, prefix="mlp.experts.*", count=experts)]
    norms = 2 * hidden  # input_layernorm + post_attention_layernorm
    layers = []
    for index, layer_type in enumerate(_layer_types(fields, num_layers)):
        if layer_type == "full_attention":
            layers.append(attention_layer(index, softmax + moe + norms, kv_heads=kv_heads, head_dim=head_dim,
                                          ffn="moe", linears=attention_linears(hidden, heads, kv_heads, head_dim)
                                          + moe_linears))
        else:
            layers.append(LayerCensus(index, LayerKind.LIGHTNING, lightning + moe + norms,
                                      recurrent_state_elements=heads * head_dim * head_dim, ffn="moe",
                                      linears=(*lightning_linears, *moe_linears)))
    return build_census(fields, layers, hidden=hidden, intermediate=expert)
