"""Nemotron-H: one mixer per layer named by hybrid_override_pattern: 'M' Mamba2, '*' attention,
'-' a non-gated relu^2 MLP, 'E' a MoE (non-gated experts, shared expert, biased sigmoid router).

Every layer carries a single RMSNorm. '-' and 'E' layers have no token mixer and hold no cache.
"""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import attention_layer, attention_linears, attention_params, require_all
from solvers.census.families.common import build_census, mlp_linears, mlp_params
from solvers.census.fields import ConfigFields
from solvers.census.layers import LayerCensus, LayerKind, Linear
from solvers.census.model import ModelCensus

# Pattern characters and the list spellings (old and new) of layers_block_type / layer_types.
_BLOCKS = {
    "M": "mamba", "mamba": "mamba", "linear_attention": "mamba",
    "*": "attention", "attention": "attention", "full_attention": "attention",
    "-": "mlp", "mlp": "mlp",
    "E": "moe", "moe": "moe",
}


# Fields each block kind needs; hidden_size and vocab_size are needed by all.
_NEEDS = {
    "mamba": ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel"),
    "attention": ("num_attention_heads", "num_key_value_heads"),
    "mlp": ("intermediate_size",),
    "moe": ("n_routed_experts", "moe_intermediate_size", "moe_shared_expert_intermediate_size"),
}
_PATTERN_NAMES = ("hybrid_override_pattern", "layers_block_type", "layer_types")


def _blocks(fields: ConfigFields) -> list[str]:
    pattern = fields.get(*_PATTERN_NAMES, default=None)
    if pattern is None:  # raises, naming the pattern and any other absent basics together
        require_all(fields, "hidden_size", "vocab_size", also_missing=(" or ".join(_PATTERN_NAMES),))
    unknown = sorted({str(block) for block in pattern if block not in _BLOCKS})
    if unknown:
        raise fields.missing(f"a pattern of M, *, - or E (got {', '.join(unknown)})")
    declared = fields.get("num_hidden_layers", default=len(pattern))
    if declared != len(pattern):
        raise fields.missing(f"a layer pattern of num_hidden_layers={declared} entries (it has {len(pattern)})")
    return [_BLOCKS[block] for block in pattern]


def _mamba2(fields: ConfigFields, hidden: int) -> tuple[int, list[Linear], int, int]:
    """(weight params, its matrices, conv state elements, recurrent state elements) of one Mamba2 mixer."""
    heads, head_dim, d_state, groups, kernel = (fields.config[name] for name in _NEEDS["mamba"])
    bias = bool(fields.get("use_bias", default=False))
    inner = heads * head_dim
    conv_channels = inner + 2 * groups * d_state  # x, B and C pass through the depthwise conv
    in_width = inner + conv_channels + heads  # z gate, conv input, dt
    params = (
        hidden * in_width + bias * in_width
        + conv_channels * kernel + bool(fields.get("use_conv_bias", default=True)) * conv_channels
        + 3 * heads  # dt_bias, A_log, D
        + inner  # gated RMSNorm
        + inner * hidden + bias * hidden  # out_proj
    )
    linears = [Linear("mixer.in_proj", in_width, hidden), Linear("mixer.out_proj", hidden, inner)]
    return params, linears, conv_channels * (kernel - 1), heads * head_dim * d_state


def _moe(fields: ConfigFields, hidden: int) -> tuple[int, list[Linear]]:
    """(weight params, matrices) of a MoE mixer: non-gated experts, a shared expert, optional latent projections."""
    experts, expert, shared = (fields.config[name] for name in _NEEDS["moe"])
    bias = bool(fields.get("mlp_bias", default=False))
    latent = fields.get("moe_latent_size", default=None)
    width = latent or hidden  # experts may work in a smaller latent space
    params = experts * hidden + experts  # router weight + e_score_correction_bias
    params += experts * 2 * expert * width  # up/down per expert, no gate, no bias
    params += mlp_params(hidden, shared, gated=False, bias=bias)
    if latent:
        params += 2 * hidden * latent + bias * (latent + hidden)
    # The router reads hidden; the experts work in `width`; the shared expert in hidden.
    linears = [Linear("mixer.gate", experts, hidden, gate=True),
               *mlp_linears(width, expert, prefix="mixer.experts.*", gated=False, count=experts),
               *mlp_linears(hidden, shared, prefix="mixer.shared_experts", gated=False)]
    if latent:
        linears += [Linear("mixer.fc1_latent_proj", latent, hidden), Linear("mixer.fc2_latent_proj", hidden, latent)]
    return params, linears


@adapter("nemotron_h")
def nemotron_h(fields: ConfigFields) -> ModelCensus:
    blocks = _blocks(fields)
    needed = dict.fromkeys(name for block in blocks for name in _NEEDS[block])
    no_head_dim = "attention" in blocks and fields.get("head_dim", "attention_head_dim", default=None) is None
    hidden = require_all(
        fields, "hidden_size", "vocab_size", *needed, also_missing=("head_dim or attention_head_dim",) * no_head_dim
    )[0]
    layers = []
    for index, block in enumerate(blocks):
        if block == "mamba":
            params, linears, conv, recurrent = _mamba2(fields, hidden)
            layers.append(LayerCensus(
                index, LayerKind.MAMBA2, params + hidden, conv_state_elements=conv,
                recurrent_state_elements=recurrent, ffn="none", linears=tuple(linears),
            ))
        elif block == "attention":
            heads, kv_heads = fields.config["num_attention_heads"], fields.config["num_key_value_heads"]
            # Published checkpoints say attention_head_dim; it is not hidden_size / heads in general.
            head_dim = fields.get("head_dim", "attention_head_dim")
            params = attention_params(hidden, heads, kv_heads, head_dim) + hidden
            layers.append(attention_layer(index, params, kv_heads=kv_heads, head_dim=head_dim, ffn="none",
                                          linears=attention_linears(hidden, heads, kv_heads, head_dim, prefix="mixer")))
        elif block == "mlp":
            intermediate = fields.get("intermediate_size")
            params = mlp_params(hidden, intermediate, gated=False, bias=bool(fields.get("mlp_bias", default=False)))
            layers.append(LayerCensus(index, LayerKind.MLP, params + hidden, ffn="dense",
                                      linears=tuple(mlp_linears(hidden, intermediate, prefix="mixer", gated=False))))
        else:
            params, linears = _moe(fields, hidden)
            layers.append(LayerCensus(index, LayerKind.MLP, params + hidden, ffn="moe", linears=tuple(linears)))
    notes = []
    if fields.get("mamba_ssm_cache_dtype", default=None):
        notes.append(f"config keeps the mamba state in {fields.get('mamba_ssm_cache_dtype')}: "
                     "pass it as the state dtype to price that")
    mtp = fields.get("num_nextn_predict_layers", default=0)
    if mtp:
        notes.append(f"{mtp} multi-token-prediction layer(s) are not counted")
    intermediate = max(fields.get("intermediate_size", default=0), fields.get("moe_intermediate_size", default=0))
    return build_census(fields, layers, hidden=hidden, intermediate=intermediate, notes=tuple(notes))
