"""Falcon-H1: every layer runs a Mamba2 mixer and GQA attention side by side (their outputs are summed), then a
gated MLP. So every layer holds both caches: KV growing with each token and a Mamba2 state per sequence.

The mixer's width is mamba_d_ssm (mamba_expand x hidden_size when it is null), split into
mamba_n_heads heads of mamba_d_head; its gated RMSNorm exists only when mamba_rms_norm is set.
"""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import KV_HEADS, attention_linears, attention_params, require_all
from solvers.census.families.common import build_census, mlp_linears, mlp_params
from solvers.census.families.mamba2 import mamba2_mixer
from solvers.census.fields import ConfigFields
from solvers.census.layers import LayerCensus, LayerKind
from solvers.census.model import ModelCensus

_MAMBA_FIELDS = ("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv")


@adapter("falcon_h1")
def falcon_h1(fields: ConfigFields) -> ModelCensus:
    hidden, num_layers, heads, intermediate, m_heads, m_head_dim, groups, d_state, kernel, *_ = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", *_MAMBA_FIELDS,
        "vocab_size", *KV_HEADS,
        # null means mamba_expand x hidden_size; an absent key is FalconH1Config's 1024, not the same statement.
        also_missing=() if "mamba_d_ssm" in fields.config else ("mamba_d_ssm",),
    )
    kv_heads = fields.config["num_key_value_heads"]
    inner = fields.get("mamba_d_ssm", default=None)
    if inner is None:
        inner = fields.get("mamba_expand") * hidden
    if m_heads * m_head_dim != inner:
        raise fields.missing(f"mamba_n_heads x mamba_d_head equal to the mixer width {inner} "
                             f"(got {m_heads} x {m_head_dim})")
    head_dim = fields.get("head_dim", default=hidden // heads)
    attention_bias = bool(fields.get("attention_bias", default=False))
    attention = attention_params(hidden, heads, kv_heads, head_dim, qkv_bias=attention_bias, o_bias=attention_bias)
    mixer = mamba2_mixer(
        hidden=hidden, inner=inner, heads=m_heads, head_dim=m_head_dim, groups=groups, d_state=d_state,
        kernel=kernel, in_bias=bool(fields.get("mamba_proj_bias", default=False)),
        conv_bias=bool(fields.get("mamba_conv_bias", default=True)),
        out_bias=bool(fields.get("projectors_bias", default=False)),
        gated_norm=bool(fields.get("mamba_rms_norm", default=False)),
    )
    mlp = mlp_params(hidden, intermediate, bias=bool(fields.get("mlp_bias", default=False)))
    linears = (*attention_linears(hidden, heads, kv_heads, head_dim), *mixer.linears,
               *mlp_linears(hidden, intermediate, prefix="feed_forward"))
    layers = [
        LayerCensus(
            index, LayerKind.ATTENTION_MAMBA2, attention + mixer.params + mlp + 2 * hidden,  # + input / pre-FF norms
            kv_elements_per_token=2 * kv_heads * head_dim, conv_state_elements=mixer.conv_state_elements,
            recurrent_state_elements=mixer.recurrent_state_elements, linears=linears,
        )
        for index in range(num_layers)
    ]
    return build_census(fields, layers, hidden=hidden, intermediate=intermediate)
