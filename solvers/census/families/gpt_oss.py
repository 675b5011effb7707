"""gpt-oss: attention with a learned sink per query head, sliding-window and full attention layers by
`layer_types`, and a biased MoE on every layer (router and experts all carry biases).

A sink is one logit per query head (`self_attn.sinks`): a weight, no cache. Sliding layers keep at most
`sliding_window` tokens per sequence. OpenAI's checkpoint stores the experts in MXFP4 (quantization_config
quant_method "mxfp4", priced in solvers/census/quantization.py) and every other tensor in bfloat16, although its
config names no dtype; such a config is priced at bfloat16, with a note.
"""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import (
    attention_layer,
    attention_linears,
    attention_params,
    declared_layer_types,
    require_all,
    sliding_window,
)
from solvers.census.families.common import build_census
from solvers.census.fields import ConfigFields
from solvers.census.layers import Linear
from solvers.census.model import ModelCensus

_PUBLISHED_DTYPE = ("bfloat16", "config names no torch_dtype; priced at bfloat16, the dtype of every tensor in "
                                "OpenAI's gpt-oss checkpoints outside the MXFP4 experts")


@adapter("gpt_oss")
def gpt_oss(fields: ConfigFields) -> ModelCensus:
    # GptOssConfig's defaults (8 kv heads, head_dim 64, an alternating plan) are gpt-oss-120b's, so they are
    # demanded rather than assumed.
    hidden, num_layers, heads, kv_heads, head_dim, experts, intermediate, _, _ = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "num_local_experts", "intermediate_size", "vocab_size", "layer_types",
    )
    layer_types = declared_layer_types(fields, num_layers)
    window = sliding_window(fields, layer_types)
    bias = bool(fields.get("attention_bias", default=True))  # GptOssConfig's default, and the published value
    attention = attention_params(hidden, heads, kv_heads, head_dim, qkv_bias=bias, o_bias=bias) + heads  # + sinks
    moe = (
        experts * hidden + experts  # router weight + bias
        + experts * (hidden * 2 * intermediate + 2 * intermediate)  # gate_up_proj + its bias
        + experts * (intermediate * hidden + hidden)  # down_proj + its bias
    )
    linears = [*attention_linears(hidden, heads, kv_heads, head_dim),
               Linear("mlp.router", experts, hidden, gate=True),
               Linear("mlp.experts.*.gate_up_proj", 2 * intermediate, hidden, experts),
               Linear("mlp.experts.*.down_proj", hidden, intermediate, experts)]
    layers = [
        attention_layer(index, attention + moe + 2 * hidden, kv_heads=kv_heads, head_dim=head_dim,
                        window=window if layer_type == "sliding_attention" else None, ffn="moe", linears=linears)
        for index, layer_type in enumerate(layer_types)
    ]
    return build_census(fields, layers, hidden=hidden, intermediate=intermediate, published_dtype=_PUBLISHED_DTYPE)
