"""DeepSeek-V2 / V3: multi-head latent attention (MLA), first_k_dense_replace dense layers, then MoE.

MLA caches one compressed latent per token and layer: kv_lora_rank + qk_rope_head_dim elements.
"""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import require_all
from solvers.census.families.common import build_census, mlp_linears
from solvers.census.fields import ConfigFields
from solvers.census.layers import LayerCensus, LayerKind, Linear
from solvers.census.model import ModelCensus

MLA_FIELDS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def mla_attention(fields: ConfigFields, hidden: int, heads: int) -> tuple[list[Linear], int]:
    """(matrices, loose params: norms and biases) of one MLA block."""
    kv_lora, nope, rope, v_dim = (fields.config[name] for name in MLA_FIELDS)
    q_lora = fields.config["q_lora_rank"]  # null on V2-Lite: a plain q_proj
    bias = bool(fields.get("attention_bias", default=False))
    q_width = heads * (nope + rope)
    if q_lora:
        linears = [Linear("self_attn.q_a_proj", q_lora, hidden), Linear("self_attn.q_b_proj", q_width, q_lora)]
        loose = q_lora + bias * q_lora  # q_a_layernorm (+ q_a_proj bias)
    else:
        linears, loose = [Linear("self_attn.q_proj", q_width, hidden)], 0
    linears += [Linear("self_attn.kv_a_proj_with_mqa", kv_lora + rope, hidden),
                Linear("self_attn.kv_b_proj", heads * (nope + v_dim), kv_lora),
                Linear("self_attn.o_proj", hidden, heads * v_dim)]
    loose += kv_lora + bias * (kv_lora + rope + hidden)  # kv_a_layernorm (+ kv_a / o_proj biases)
    return linears, loose


def _moe_freq(fields: ConfigFields) -> int:
    # DeepSeek's own modeling code makes a layer MoE when index % moe_layer_freq == 0 (transformers
    # assumes 1, which every published config uses).
    return fields.get("moe_layer_freq", default=1)


def _ffn(fields: ConfigFields, hidden: int, index: int) -> tuple[list[Linear], int, str]:
    """(matrices, loose params, "dense" | "moe") of one layer's FFN."""
    experts = fields.get("n_routed_experts", default=0)
    if not experts or index < fields.get("first_k_dense_replace", default=0) or index % _moe_freq(fields):
        return mlp_linears(hidden, fields.config["intermediate_size"]), 0, "dense"
    expert = fields.config["moe_intermediate_size"]
    shared = expert * fields.get("n_shared_experts", default=0)
    linears = [Linear("mlp.gate", experts, hidden, gate=True),
               *mlp_linears(hidden, expert, prefix="mlp.experts.*", count=experts)]
    if shared:
        linears += mlp_linears(hidden, shared, prefix="mlp.shared_experts")
    # V3's sigmoid router learns a per-expert score correction bias next to its weight.
    correction = experts if fields.family == "deepseek_v3" else 0
    return linears, correction, "moe"


@adapter("deepseek_v2", "deepseek_v3")
def deepseek(fields: ConfigFields) -> ModelCensus:
    experts = fields.get("n_routed_experts", default=0)
    has_dense = not experts or fields.get("first_k_dense_replace", default=0) > 0 or _moe_freq(fields) > 1
    hidden, num_layers, heads, kv_lora, _, rope, *_ = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", *MLA_FIELDS, "vocab_size",
        *(("intermediate_size",) if has_dense else ()), *(("moe_intermediate_size",) if experts else ()),
        # null means a plain q_proj (V2-Lite); an absent key is not the same statement, so it is demanded.
        also_missing=() if "q_lora_rank" in fields.config else ("q_lora_rank",),
    )
    attention, attention_loose = mla_attention(fields, hidden, heads)
    layers = []
    for index in range(num_layers):
        ffn, ffn_loose, ffn_kind = _ffn(fields, hidden, index)
        linears = (*attention, *ffn)
        loose = attention_loose + ffn_loose + 2 * hidden  # + input / post_attention RMSNorms
        layers.append(LayerCensus(
            index, LayerKind.MLA, sum(linear.params for linear in linears) + loose,
            kv_elements_per_token=kv_lora + rope, ffn=ffn_kind, linears=linears,
        ))
    notes = []
    mtp = fields.get("num_nextn_predict_layers", default=0)
    if mtp:
        notes.append(f"{mtp} multi-token-prediction layer(s) in the checkpoint are not counted (not used for serving)")
    intermediate = max(fields.get("intermediate_size", default=0), fields.get("moe_intermediate_size", default=0))
    return build_census(fields, layers, hidden=hidden, intermediate=intermediate, notes=tuple(notes))
