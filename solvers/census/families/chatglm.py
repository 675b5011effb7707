"""ChatGLM2 / ChatGLM3 / GLM-4 (remote-code `chatglm`): Megatron-style names for a GQA decoder.

One fused query_key_value projection (optionally biased), a fused gate+up `dense_h_to_4h`, RMSNorm or
LayerNorm, and an untied `output_layer`. Not in transformers, so the layout follows the published
modeling_chatglm.py.
"""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import attention_layer, require_all
from solvers.census.families.common import build_census, mlp_params
from solvers.census.fields import ConfigFields
from solvers.census.layers import Linear
from solvers.census.model import ModelCensus


@adapter("chatglm")
def chatglm(fields: ConfigFields) -> ModelCensus:
    # Without multi_query_attention every head keeps its own K and V.
    multi_query = bool(fields.get("multi_query_attention", default=False))
    hidden, num_layers, heads, ffn_hidden, _, *groups = require_all(
        fields, "hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size", "padded_vocab_size",
        *(("multi_query_group_num",) if multi_query else ()),
    )
    kv_heads = groups[0] if multi_query else heads
    head_dim = fields.get("kv_channels", default=hidden // heads)
    linear_bias = bool(fields.get("add_bias_linear", default=False))
    qkv_bias = linear_bias or bool(fields.get("add_qkv_bias", default=False))
    # RMSNorm has a weight; LayerNorm a weight and a bias.
    norm = hidden if fields.get("rmsnorm", default=True) else 2 * hidden

    qkv_width = (heads + 2 * kv_heads) * head_dim
    attention = hidden * qkv_width + qkv_bias * qkv_width + heads * head_dim * hidden + linear_bias * hidden
    per_layer = attention + mlp_params(hidden, ffn_hidden, bias=linear_bias) + 2 * norm
    linears = [
        Linear("self_attention.query_key_value", qkv_width, hidden), Linear("self_attention.dense", hidden,
                                                                             heads * head_dim),
        Linear("mlp.dense_h_to_4h", 2 * ffn_hidden, hidden), Linear("mlp.dense_4h_to_h", hidden, ffn_hidden),
    ]
    layers = [attention_layer(index, per_layer, kv_heads=kv_heads, head_dim=head_dim, linears=linears)
              for index in range(num_layers)]
    final_norm = norm if fields.get("post_layer_norm", default=True) else 0
    notes = ()
    if fields.get("pre_seq_len", default=None):
        notes = ("p-tuning prefix encoder (pre_seq_len) not counted",)
    return build_census(
        fields, layers, hidden=hidden, intermediate=ffn_hidden, vocab_field=("padded_vocab_size",),
        final_norm_params=final_norm, notes=notes,
    )
