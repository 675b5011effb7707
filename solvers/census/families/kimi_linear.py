"""Kimi-Linear (kimi_linear): KDA linear-attention layers and MLA softmax layers, named by
linear_attn_config's 1-based kda_layers / full_attn_layers (or a `layer_types` list); first_k_dense_replace dense
layers, then MoE (sigmoid router with a score-correction bias, shared experts).

A KDA layer (Kimi delta attention: gated DeltaNet with a per-channel decay) keeps per sequence one short-conv
window for each of q, k and v, 3 x heads x head_dim x (kernel - 1), and a recurrent state of heads x head_dim x
head_dim. An MLA layer caches kv_lora_rank + qk_rope_head_dim elements per token (its keys skip RoPE, mla_use_nope,
but the rope part of the latent is still cached).
"""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import require_all
from solvers.census.families.common import build_census, mlp_linears, mlp_params
from solvers.census.families.deepseek import MLA_FIELDS, mla_attention
from solvers.census.fields import ConfigFields
from solvers.census.layers import LayerCensus, LayerKind, Linear
from solvers.census.model import ModelCensus

_KDA_FIELDS = ("num_heads", "head_dim", "short_conv_kernel_size")


def _layer_types(fields: ConfigFields, num_layers: int) -> list[str]:
    declared = fields.get("layer_types", default=None)
    if declared is None:
        linear = fields.get("linear_attn_config", "layer_types")  # absent: the error names either way to say it
        kda, full = linear.get("kda_layers"), linear.get("full_attn_layers")
        if kda is None or full is None:
            raise fields.missing("linear_attn_config.kda_layers and linear_attn_config.full_attn_layers")
        if sorted([*kda, *full]) != list(range(1, num_layers + 1)):
            raise fields.missing(f"kda_layers and full_attn_layers naming layers 1..{num_layers} once each")
        declared = ["linear_attention" if number in kda else "full_attention" for number in range(1, num_layers + 1)]
    if len(declared) != num_layers or not set(declared) <= {"linear_attention", "full_attention"}:
        raise fields.missing(f"layer_types of {num_layers} linear_attention / full_attention entries")
    return list(declared)


def _kda(fields: ConfigFields, hidden: int) -> tuple[int, list[Linear], int, int]:
    """(params, matrices, conv state elements, recurrent state elements) of one KDA mixer."""
    linear = fields.get("linear_attn_config")
    absent = [f"linear_attn_config.{name}" for name in _KDA_FIELDS if linear.get(name) is None]
    if absent:
        raise fields.missing(*absent)
    heads, head_dim, kernel = (linear[name] for name in _KDA_FIELDS)
    width = heads * head_dim
    linears = [*(Linear(f"self_attn.{name}_proj", width, hidden) for name in "qkv"),
               Linear("self_attn.forget_gate.f_a_proj", head_dim, hidden),
               Linear("self_attn.forget_gate.f_b_proj", width, head_dim),
               Linear("self_attn.b_proj", heads, hidden),
               Linear("self_attn.g_a_proj", head_dim, hidden), Linear("self_attn.g_b_proj", width, head_dim),
               Linear("self_attn.o_proj", hidden, width)]
    loose = (3 * width * kernel  # q/k/v depthwise short convs, no bias
             + width + heads  # dt_bias, A_log
             + head_dim)  # gated output RMSNorm
    params = sum(linear.params for linear in linears) + loose
    return params, linears, 3 * width * (kernel - 1), heads * head_dim * head_dim


def _moe(fields: ConfigFields, hidden: int, experts: int) -> tuple[int, list[Linear]]:
    expert = fields.get("moe_intermediate_size")
    shared = expert * fields.get("num_shared_experts", "n_shared_experts", default=1)
    params = experts * hidden + experts  # router weight + e_score_correction_bias
    params += experts * mlp_params(hidden, expert) + mlp_params(hidden, shared)
    linears = [Linear("mlp.gate", experts, hidden, gate=True),
               *mlp_linears(hidden, expert, prefix="mlp.experts.*", count=experts),
               *mlp_linears(hidden, shared, prefix="mlp.shared_experts")]
    return params, linears


@adapter("kimi_linear")
def kimi_linear(fields: ConfigFields) -> ModelCensus:
    hidden, num_layers, heads, intermediate, experts, kv_lora, _, rope, *_ = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "num_experts",
        *MLA_FIELDS, "vocab_size", "moe_intermediate_size",
        # null means a plain q_proj (the published model); an absent key is not the same statement.
        also_missing=() if "q_lora_rank" in fields.config else ("q_lora_rank",),
    )
    layer_types = _layer_types(fields, num_layers)
    mla, mla_loose = mla_attention(fields, hidden, heads)
    mla_params = sum(linear.params for linear in mla) + mla_loose
    kda, kda_linears, conv, recurrent = _kda(fields, hidden) if "linear_attention" in layer_types else (0, [], 0, 0)
    moe, moe_linears = _moe(fields, hidden, experts)
    first_dense = fields.get("first_k_dense_replace", default=1)  # KimiLinearConfig's default
    moe_freq = fields.get("moe_layer_freq", default=1)
    layers = []
    for index, layer_type in enumerate(layer_types):
        if index < first_dense or index % moe_freq:
            ffn, ffn_linears, kind = mlp_params(hidden, intermediate), mlp_linears(hidden, intermediate), "dense"
        else:
            ffn, ffn_linears, kind = moe, moe_linears, "moe"
        norms = 2 * hidden  # input_layernorm + post_attention_layernorm
        if layer_type == "full_attention":
            layers.append(LayerCensus(index, LayerKind.MLA, mla_params + ffn + norms,
                                      kv_elements_per_token=kv_lora + rope, ffn=kind, linears=(*mla, *ffn_linears)))
        else:
            layers.append(LayerCensus(index, LayerKind.KDA, kda + ffn + norms, conv_state_elements=conv,
                                      recurrent_state_elements=recurrent, ffn=kind,
                                      linears=(*kda_linears, *ffn_linears)))
    notes = []
    mtp = fields.get("num_nextn_predict_layers", default=0)
    if mtp:
        notes.append(f"{mtp} multi-token-prediction layer(s) are not counted: the engine does not run them")
    return build_census(fields, layers, hidden=hidden,
                        intermediate=max(intermediate, fields.config["moe_intermediate_size"]), notes=tuple(notes))
