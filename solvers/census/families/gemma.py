"""Gemma 2 and Gemma 3: sliding and full attention interleaved, gated GeLU MLP, four RMSNorms per layer
(pre/post attention and pre/post feed-forward); Gemma 3 adds per-head q/k norms.

Gemma 3's multimodal config wraps the language model in `text_config` next to a SigLIP `vision_config`;
the vision tower and its projector are priced exactly and carried with the embeddings (first rank).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from solvers.census.families import adapter
from solvers.census.families.attention import (
    KV_HEADS,
    attention_layer,
    attention_linears,
    attention_params,
    declared_layer_types,
    require_all,
)
from solvers.census.families.common import build_census, mlp_linears, mlp_params
from solvers.census.fields import ConfigFields
from solvers.census.model import ModelCensus

# The config classes' own defaults: published Gemma configs leave these out (gemma-3-27b's text_config
# has no vocab_size), and transformers fills them in exactly so. Each one applied is named in the notes.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma2": {"vocab_size": 256_000, "head_dim": 256, "sliding_window": 4096, "tie_word_embeddings": True},
    "gemma3": {
        "vocab_size": 262_208, "head_dim": 256, "sliding_window": 4096, "tie_word_embeddings": True,
        "sliding_window_pattern": 6,
    },
}


def _text_fields(fields: ConfigFields) -> tuple[ConfigFields, list[str]]:
    """The language model's fields (unwrapped from text_config), with the family defaults filled in."""
    config = fields.config
    base = "gemma2" if fields.family == "gemma2" else "gemma3"
    text = config.get("text_config") if fields.family == "gemma3" else None
    merged = {key: value for key, value in (text or config).items() if value is not None}
    for key in ("torch_dtype", "dtype", "tie_word_embeddings"):
        if key not in merged and config.get(key) is not None:
            merged[key] = config[key]
    applied = []
    for key, value in _DEFAULTS[base].items():
        if key not in merged:
            merged[key] = value
            applied.append(f"{key}={value}")
    merged["model_type"] = config["model_type"]
    source = f"{fields.source} (text_config)" if text is not None else fields.source
    notes = [f"{base} defaults applied for absent fields: {', '.join(applied)}"] if applied else []
    return ConfigFields(merged, fields.family, source), notes


def _layer_types(fields: ConfigFields, num_layers: int) -> list[str]:
    declared = declared_layer_types(fields, num_layers)
    if declared is not None:
        return declared
    # Gemma 2 alternates local/global starting local; Gemma 3 has one global layer per pattern period.
    period = 2 if fields.family == "gemma2" else fields.get("sliding_window_pattern")
    return ["full_attention" if (index + 1) % period == 0 else "sliding_attention" for index in range(num_layers)]


def siglip_params(vision: ConfigFields) -> int:
    """A SigLIP vision tower: patch conv, position table, pre-LN encoder layers with biases, post-LN, optional head."""
    hidden, intermediate, num_layers, image, patch = require_all(
        vision, "hidden_size", "intermediate_size", "num_hidden_layers", "image_size", "patch_size"
    )
    channels = vision.get("num_channels", default=3)
    mlp = hidden * intermediate + intermediate + intermediate * hidden + hidden  # fc1, fc2 with biases
    layer = 2 * (2 * hidden) + 4 * (hidden * hidden + hidden) + mlp  # two LayerNorms, q/k/v/out with biases
    params = channels * patch * patch * hidden + hidden + (image // patch) ** 2 * hidden
    params += num_layers * layer + 2 * hidden  # + post_layernorm
    if vision.get("vision_use_head", default=True):
        # Attention-pooling head: probe, nn.MultiheadAttention (packed in_proj + out_proj), LayerNorm, MLP.
        params += hidden + (3 * hidden * hidden + 3 * hidden) + (hidden * hidden + hidden) + 2 * hidden + mlp
    return params


@adapter("gemma2", "gemma3", "gemma3_text")
def gemma(fields: ConfigFields) -> ModelCensus:
    text, notes = _text_fields(fields)
    hidden, num_layers, heads, intermediate, kv_heads = require_all(
        text, "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", *KV_HEADS
    )
    head_dim = text.get("head_dim")
    bias = bool(text.get("attention_bias", default=False))
    per_layer = attention_params(
        hidden, heads, kv_heads, head_dim, qkv_bias=bias, o_bias=bias, qk_norm=fields.family != "gemma2"
    )
    per_layer += mlp_params(hidden, intermediate) + 4 * hidden  # four RMSNorms
    linears = attention_linears(hidden, heads, kv_heads, head_dim) + mlp_linears(hidden, intermediate)
    layer_types = _layer_types(text, num_layers)
    window = text.get("sliding_window") if "sliding_attention" in layer_types else None
    layers = [
        attention_layer(
            index, per_layer, kv_heads=kv_heads, head_dim=head_dim,
            window=window if layer_type == "sliding_attention" else None, linears=linears,
        )
        for index, layer_type in enumerate(layer_types)
    ]
    census = build_census(text, layers, hidden=hidden, intermediate=intermediate, notes=tuple(notes))
    if fields.family != "gemma3":
        return census
    vision_config = fields.config.get("vision_config")
    if vision_config is None:
        return replace(census, notes=(*census.notes, "no vision_config: the vision tower is not counted"))
    vision = ConfigFields(vision_config, fields.family, f"{fields.source} (vision_config)")
    vision_hidden = vision.get("hidden_size")
    # Projector: a (vision_hidden x hidden) matrix and an RMSNorm over the vision features.
    vision_params = siglip_params(vision) + vision_hidden * hidden + vision_hidden
    return replace(
        census, embedding_params=census.embedding_params + vision_params,
        notes=(*census.notes, f"SigLIP vision tower + projector ({vision_params:,} params) counted with the "
               "embeddings on the first rank"),
    )
