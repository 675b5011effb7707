"""GLM-4.5 / GLM-4.5-Air (glm4_moe): GQA attention with q/k/v biases and optional per-head q/k norms,
first_k_dense_replace dense layers, then MoE layers (sigmoid router with a score-correction bias, shared experts).

Partial rotary (partial_rotary_factor) rotates part of each head and changes no price. The checkpoint also holds
num_nextn_predict_layers multi-token-prediction layer(s) after the last decoder layer (`model.layers.<N>.*`). The
engine runs no MTP layer (its loader skips `mtp.*` tensors) and transformers ignores these, so they are not
priced; the census notes it.
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
from solvers.census.layers import Linear
from solvers.census.model import ModelCensus


def _moe(hidden: int, experts: int, expert: int, shared: int) -> tuple[int, list[Linear]]:
    params = experts * hidden + experts  # router weight + e_score_correction_bias
    params += experts * mlp_params(hidden, expert) + mlp_params(hidden, shared)
    linears = [Linear("mlp.gate", experts, hidden, gate=True),
               *mlp_linears(hidden, expert, prefix="mlp.experts.*", count=experts),
               *mlp_linears(hidden, shared, prefix="mlp.shared_experts")]
    return params, linears


@adapter("glm4_moe")
def glm4_moe(fields: ConfigFields) -> ModelCensus:
    hidden, num_layers, heads, dense_intermediate, experts, expert, first_dense, *_ = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "n_routed_experts",
        "moe_intermediate_size", "first_k_dense_replace", "vocab_size", *KV_HEADS,
    )
    kv_heads = fields.config["num_key_value_heads"]
    head_dim = fields.get("head_dim", default=hidden // heads)
    bias = bool(fields.get("attention_bias", default=False))
    qk_norm = bool(fields.get("use_qk_norm", default=False))
    # q/k/v carry attention_bias, o_proj never does.
    attention = attention_params(hidden, heads, kv_heads, head_dim, qkv_bias=bias, qk_norm=qk_norm)
    attention_matrices = attention_linears(hidden, heads, kv_heads, head_dim)
    moe, moe_linears = _moe(hidden, experts, expert, expert * fields.get("n_shared_experts", default=1))
    layers = []
    for index in range(num_layers):
        if index < first_dense:
            ffn, kind = mlp_params(hidden, dense_intermediate), "dense"
            ffn_linears = mlp_linears(hidden, dense_intermediate)
        else:
            ffn, ffn_linears, kind = moe, moe_linears, "moe"
        layers.append(attention_layer(index, attention + ffn + 2 * hidden, kv_heads=kv_heads, head_dim=head_dim,
                                      ffn=kind, linears=attention_matrices + ffn_linears))
    notes = []
    mtp = fields.get("num_nextn_predict_layers", default=0)
    if mtp:
        notes.append(f"{mtp} multi-token-prediction layer(s) in the checkpoint (model.layers.{num_layers}.*) are not "
                     "counted: the engine does not run multi-token-prediction layers")
    return build_census(fields, layers, hidden=hidden, intermediate=max(dense_intermediate, expert),
                        notes=tuple(notes))
