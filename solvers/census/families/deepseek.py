"""DeepSeek-V2 / V3: multi-head latent attention (MLA), first_k_dense_replace dense layers, then MoE.

MLA caches one compressed latent per token and layer: kv_lora_rank + qk_rope_head_dim elements.
"""

from __future__ import annotations

import math
from dataclasses import replace

from solvers.census.families import adapter
from solvers.census.families.attention import require_all
from solvers.census.families.common import build_census
from solvers.census.fields import ConfigFields
from solvers.census.model import LayerCensus, LayerKind, ModelCensus

# A layer as weight matrices (out, in, how many) plus loose parameters: norms, router, biases.
Matrices = list[tuple[int, int, int]]
_MLA_FIELDS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _attention(fields: ConfigFields, hidden: int, heads: int) -> tuple[Matrices, int]:
    kv_lora, nope, rope, v_dim = (fields.config[name] for name in _MLA_FIELDS)
    q_lora = fields.config["q_lora_rank"]  # null on V2-Lite: a plain q_proj
    bias = bool(fields.get("attention_bias", default=False))
    q_width = heads * (nope + rope)
    if q_lora:
        matrices = [(q_lora, hidden, 1), (q_width, q_lora, 1)]
        loose = q_lora + bias * q_lora  # q_a_layernorm (+ q_a_proj bias)
    else:
        matrices, loose = [(q_width, hidden, 1)], 0
    matrices += [(kv_lora + rope, hidden, 1), (heads * (nope + v_dim), kv_lora, 1), (hidden, heads * v_dim, 1)]
    loose += kv_lora + bias * (kv_lora + rope + hidden)  # kv_a_layernorm (+ kv_a / o_proj biases)
    return matrices, loose


def _moe_freq(fields: ConfigFields) -> int:
    # DeepSeek's own modeling code makes a layer MoE when index % moe_layer_freq == 0 (transformers
    # assumes 1, which every published config uses).
    return fields.get("moe_layer_freq", default=1)


def _ffn(fields: ConfigFields, hidden: int, index: int) -> tuple[Matrices, int, int, str]:
    """(matrices, loose bf16 params, loose fp32 params, "dense" | "moe") of one layer's FFN."""
    experts = fields.get("n_routed_experts", default=0)
    if not experts or index < fields.get("first_k_dense_replace", default=0) or index % _moe_freq(fields):
        intermediate = fields.config["intermediate_size"]
        return [(intermediate, hidden, 2), (hidden, intermediate, 1)], 0, 0, "dense"
    expert = fields.config["moe_intermediate_size"]
    shared = expert * fields.get("n_shared_experts", default=0)
    matrices = [(expert, hidden, 2 * experts), (hidden, expert, experts)]
    if shared:
        matrices += [(shared, hidden, 2), (hidden, shared, 1)]
    # V3's sigmoid router learns a per-expert score correction bias (kept in fp32) next to its weight.
    correction = experts if fields.family == "deepseek_v3" else 0
    return matrices, experts * hidden, correction, "moe"


def _fp8_block_bytes(matrices: Matrices, block: tuple[int, int]) -> int:
    """fp8 weights plus one fp32 inverse scale per (block x block) tile, as the checkpoint stores them."""
    return sum(
        count * (out * inp + 4 * math.ceil(out / block[0]) * math.ceil(inp / block[1])) for out, inp, count in matrices
    )


@adapter("deepseek_v2", "deepseek_v3")
def deepseek(fields: ConfigFields) -> ModelCensus:
    experts = fields.get("n_routed_experts", default=0)
    has_dense = not experts or fields.get("first_k_dense_replace", default=0) > 0 or _moe_freq(fields) > 1
    hidden, num_layers, heads, kv_lora, _, rope, *_ = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", *_MLA_FIELDS, "vocab_size",
        *(("intermediate_size",) if has_dense else ()), *(("moe_intermediate_size",) if experts else ()),
        # null means a plain q_proj (V2-Lite); an absent key is not the same statement, so it is demanded.
        also_missing=() if "q_lora_rank" in fields.config else ("q_lora_rank",),
    )
    attention, attention_loose = _attention(fields, hidden, heads)
    quant = fields.get("quantization_config", default={})
    fp8 = quant.get("quant_method") == "fp8" and quant.get("weight_block_size")
    layers, fp8_bytes = [], 0
    for index in range(num_layers):
        ffn, ffn_loose, fp32_loose, ffn_kind = _ffn(fields, hidden, index)
        matrices = attention + ffn
        loose = attention_loose + ffn_loose + 2 * hidden  # + input / post_attention RMSNorms
        params = sum(out * inp * count for out, inp, count in matrices) + loose + fp32_loose
        layers.append(LayerCensus(index, LayerKind.MLA, params, kv_elements_per_token=kv_lora + rope, ffn=ffn_kind))
        if fp8:
            fp8_bytes += _fp8_block_bytes(matrices, tuple(quant["weight_block_size"])) + 2 * loose + 4 * fp32_loose

    notes = []
    mtp = fields.get("num_nextn_predict_layers", default=0)
    if mtp:
        notes.append(f"{mtp} multi-token-prediction layer(s) in the checkpoint are not counted (not used for serving)")
    dtype = fields.get("torch_dtype", "dtype", default="float32")
    layer_params = sum(layer.weight_params for layer in layers)
    if fp8:
        notes.append(
            f"checkpoint is fp8 ({quant.get('fmt', 'e4m3')}) with {quant['weight_block_size']} block scales: "
            f"decoder layers priced at {fp8_bytes / layer_params:.5f} bytes/param ({fp8_bytes / 2**30:.1f} GiB; "
            f"{layer_params * 2 / 2**30:.1f} GiB if dequantised to bf16); each layer uses this average width "
            f"(dense and MoE layers differ by <0.1%); embeddings, lm_head and norms stay {dtype}"
        )
    elif quant:
        notes.append(f"quantization_config {quant.get('quant_method')!r} not priced; weights at {dtype}")
    intermediate = max(fields.get("intermediate_size", default=0), fields.get("moe_intermediate_size", default=0))
    census = build_census(fields, layers, hidden=hidden, intermediate=intermediate, notes=tuple(notes))
    return replace(census, weight_width_override=fp8_bytes / layer_params) if fp8 else census
