"""Pieces the attention families share: projection counts, layer-type rules and an attention layer's census.

Not an adapter itself; the family modules (llama, qwen, gemma, ...) build on it.
"""

from __future__ import annotations

from solvers.census.fields import ConfigFields
from solvers.census.layers import LayerCensus, LayerKind, Linear

ATTENTION_TYPES = ("full_attention", "sliding_attention")


def attention_params(
    hidden: int, heads: int, kv_heads: int, head_dim: int, *,
    qkv_bias: bool = False, o_bias: bool = False, qk_norm: bool = False,
) -> int:
    """q/k/v/o projections, their biases, and per-head q/k RMSNorms (Qwen3, Gemma3)."""
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    params = hidden * (q_width + 2 * kv_width) + q_width * hidden
    params += (q_width + 2 * kv_width) if qkv_bias else 0
    params += hidden if o_bias else 0
    params += 2 * head_dim if qk_norm else 0
    return params


def attention_linears(hidden: int, heads: int, kv_heads: int, head_dim: int, *, prefix: str = "self_attn",
                      q_gate: bool = False) -> list[Linear]:
    """The q/k/v/o matrices attention_params counts (`q_gate`: q_proj also emits an output gate, Qwen3-Next)."""
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    return [Linear(f"{prefix}.q_proj", q_width * (2 if q_gate else 1), hidden),
            Linear(f"{prefix}.k_proj", kv_width, hidden), Linear(f"{prefix}.v_proj", kv_width, hidden),
            Linear(f"{prefix}.o_proj", hidden, q_width)]


def attention_layer(
    index: int, weight_params: int, *, kv_heads: int, head_dim: int, window: int | None = None, ffn: str = "dense",
    linears: list[Linear] | tuple[Linear, ...] = (),
) -> LayerCensus:
    """A full or sliding attention layer; a window turns its KV into a per-sequence cost capped at `window`."""
    kv_elements = 2 * kv_heads * head_dim
    if window:
        return LayerCensus(
            index, LayerKind.SLIDING_ATTENTION, weight_params,
            kv_elements_per_token=kv_elements, window_tokens=int(window), ffn=ffn, linears=tuple(linears),
        )
    return LayerCensus(index, LayerKind.FULL_ATTENTION, weight_params, kv_elements_per_token=kv_elements, ffn=ffn,
                       linears=tuple(linears))


def declared_layer_types(fields: ConfigFields, num_layers: int) -> list[str] | None:
    """An explicit `layer_types` list (newer configs serialise it), checked; None when the config has none."""
    declared = fields.get("layer_types", default=None)
    if declared is None:
        return None
    if len(declared) != num_layers:
        raise fields.missing(f"layer_types with {num_layers} entries (it has {len(declared)})")
    unknown = sorted({kind for kind in declared if kind not in ATTENTION_TYPES})
    if unknown:
        raise fields.missing(f"layer_types of {' or '.join(ATTENTION_TYPES)} (got {', '.join(unknown)})")
    return list(declared)


def sliding_window(fields: ConfigFields, layer_types: list[str]) -> int | None:
    """The window of the sliding layers: required as soon as one layer slides."""
    if "sliding_attention" not in layer_types:
        return None
    return fields.get("sliding_window")


# Families whose reference config class does not read an absent num_key_value_heads as plain multi-head
# attention (MistralConfig assumes 8, Qwen3MoeConfig 4, ...): for them the field is demanded, not assumed.
KV_HEADS = ("num_key_value_heads",)


def head_geometry(fields: ConfigFields, hidden: int, heads: int) -> tuple[int, int]:
    """(kv_heads, head_dim): Llama-style configs omit both when attention is plain multi-head."""
    kv_heads = fields.get("num_key_value_heads", default=heads)
    head_dim = fields.get("head_dim", default=None) or hidden // heads
    return kv_heads, head_dim


def require_all(fields: ConfigFields, *names: str, also_missing: tuple[str, ...] = ()) -> list:
    """Like ConfigFields.require, but one error also lists `also_missing` (alternatives found absent
    earlier), so an operator fixing a config learns every missing field at once."""
    absent = [*also_missing, *(name for name in names if fields.config.get(name) is None)]
    if absent:
        raise fields.missing(*absent)
    return [fields.config[name] for name in names]
