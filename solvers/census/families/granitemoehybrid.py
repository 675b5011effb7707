"""Granite-4.0-H (granitemoehybrid): each layer's mixer is Mamba2 or GQA attention, named by `layer_types`
("mamba" / "attention", or "linear_attention" / "full_attention"); every layer then runs a MoE (when
num_local_experts > 0) plus a shared gated MLP of shared_intermediate_size.

The mixer's width is mamba_expand x hidden_size, split into mamba_n_heads heads of mamba_d_head; its gated
RMSNorm is always present.
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
from solvers.census.families.common import build_census, mlp_params
from solvers.census.families.mamba2 import mamba2_mixer
from solvers.census.fields import ConfigFields
from solvers.census.layers import LayerCensus, LayerKind, Linear
from solvers.census.model import ModelCensus

_MIXERS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}
_MAMBA_FIELDS = ("mamba_n_heads", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand")


def _mixers(fields: ConfigFields, num_layers: int) -> list[str]:
    # GraniteMoeHybridConfig assumes all-mamba without a list; no published model is, so the list is demanded.
    declared = fields.get("layer_types", "layers_block_type")
    if len(declared) != num_layers:
        raise fields.missing(f"layer_types with {num_layers} entries (it has {len(declared)})")
    unknown = sorted({str(kind) for kind in declared if str(kind) not in _MIXERS})
    if unknown:
        raise fields.missing(f"layer_types of mamba or attention (got {', '.join(unknown)})")
    return [_MIXERS[kind] for kind in declared]


def _ffn(fields: ConfigFields, hidden: int) -> tuple[int, list[Linear]]:
    """(params, matrices) of the MoE and the shared MLP, the same in every layer."""
    experts = fields.get("num_local_experts", default=0)
    shared = fields.get("shared_intermediate_size")
    params = mlp_params(hidden, shared)
    linears = [Linear("shared_mlp.input_linear", 2 * shared, hidden),
               Linear("shared_mlp.output_linear", hidden, shared)]
    if experts:
        expert = fields.get("intermediate_size")
        params += experts * hidden + experts * mlp_params(hidden, expert)  # router (no bias) + experts
        linears += [Linear("block_sparse_moe.router", experts, hidden, gate=True),
                    Linear("block_sparse_moe.experts.*.gate_up_proj", 2 * expert, hidden, experts),
                    Linear("block_sparse_moe.experts.*.down_proj", hidden, expert, experts)]
    return params, linears


@adapter("granitemoehybrid")
def granitemoehybrid(fields: ConfigFields) -> ModelCensus:
    hidden, num_layers, heads, *_ = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "shared_intermediate_size",
        *KV_HEADS,
    )
    mixers = _mixers(fields, num_layers)
    kv_heads = fields.config["num_key_value_heads"]
    head_dim = hidden // heads
    bias = bool(fields.get("attention_bias", default=False))
    attention = attention_params(hidden, heads, kv_heads, head_dim, qkv_bias=bias, o_bias=bias)
    ffn, ffn_linears = _ffn(fields, hidden)
    kind = "moe" if fields.get("num_local_experts", default=0) else "dense"
    norms = 2 * hidden  # input_layernorm + post_attention_layernorm
    mixer = None
    if "mamba" in mixers:
        m_heads, groups, d_state, kernel, expand = require_all(fields, *_MAMBA_FIELDS)
        inner = expand * hidden
        m_head_dim = fields.get("mamba_d_head", default="auto")
        m_head_dim = inner // m_heads if m_head_dim == "auto" else m_head_dim
        if m_heads * m_head_dim != inner:
            raise fields.missing(f"mamba_n_heads x mamba_d_head equal to mamba_expand x hidden_size = {inner} "
                                 f"(got {m_heads} x {m_head_dim})")
        mixer = mamba2_mixer(
            hidden=hidden, inner=inner, heads=m_heads, head_dim=m_head_dim, groups=groups, d_state=d_state,
            kernel=kernel, in_bias=bool(fields.get("mamba_proj_bias", default=False)),
            conv_bias=bool(fields.get("mamba_conv_bias", default=True)),
            out_bias=bool(fields.get("mamba_proj_bias", default=False)), gated_norm=True,
        )
    layers = []
    for index, block in enumerate(mixers):
        if block == "attention":
            layers.append(attention_layer(index, attention + ffn + norms, kv_heads=kv_heads, head_dim=head_dim,
                                          ffn=kind, linears=attention_linears(hidden, heads, kv_heads, head_dim)
                                          + ffn_linears))
        else:
            layers.append(LayerCensus(
                index, LayerKind.MAMBA2, mixer.params + ffn + norms, conv_state_elements=mixer.conv_state_elements,
                recurrent_state_elements=mixer.recurrent_state_elements, ffn=kind,
                linears=(*mixer.linears, *ffn_linears),
            ))
    intermediate = max(fields.get("intermediate_size", default=0), fields.config["shared_intermediate_size"])
    return build_census(fields, layers, hidden=hidden, intermediate=intermediate)
