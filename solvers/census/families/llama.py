"""Llama and Mistral: dense decoder, GQA attention, gated SiLU MLP, two RMSNorms per layer."""

from __future__ import annotations

from solvers.census.families import adapter
from solvers.census.families.attention import (
    KV_HEADS,
    attention_layer,
    attention_linears,
    attention_params,
    head_geometry,
    require_all,
)
from solvers.census.families.common import build_census, mlp_linears, mlp_params
from solvers.census.fields import ConfigFields
from solvers.census.model import ModelCensus

# transformers' MistralConfig windows every layer at 4096 tokens when the key is absent altogether;
# an explicit null (Mistral-7B-v0.3) means full attention.
_MISTRAL_DEFAULT_WINDOW = 4096


@adapter("llama", "mistral")
def llama(fields: ConfigFields) -> ModelCensus:
    hidden, num_layers, heads, intermediate, *_ = require_all(
        fields, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
        *(KV_HEADS if fields.family == "mistral" else ()),
    )
    kv_heads, head_dim = head_geometry(fields, hidden, heads)
    notes: tuple[str, ...] = ()
    if fields.family == "mistral":
        # Mistral's projections never carry biases, whatever the config says.
        attention = attention_params(hidden, heads, kv_heads, head_dim)
        mlp = mlp_params(hidden, intermediate)
        if "sliding_window" in fields.config:
            window = fields.config["sliding_window"]
        else:
            window = _MISTRAL_DEFAULT_WINDOW
            notes = (f"config omits sliding_window; every layer windowed at {window} tokens as transformers does",)
    else:
        bias = bool(fields.get("attention_bias", default=False))
        attention = attention_params(hidden, heads, kv_heads, head_dim, qkv_bias=bias, o_bias=bias)
        mlp = mlp_params(hidden, intermediate, bias=bool(fields.get("mlp_bias", default=False)))
        window = None
    per_layer = attention + mlp + 2 * hidden  # input_layernorm + post_attention_layernorm
    linears = attention_linears(hidden, heads, kv_heads, head_dim) + mlp_linears(hidden, intermediate)
    layers = [
        attention_layer(index, per_layer, kv_heads=kv_heads, head_dim=head_dim, window=window, linears=linears)
        for index in range(num_layers)
    ]
    return build_census(fields, layers, hidden=hidden, intermediate=intermediate, notes=notes)
