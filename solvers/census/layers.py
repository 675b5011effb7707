"""The pieces of a census, layer by layer: each layer's kind, its weight matrices and what it stores per token and
per sequence (docs/domain.md §2). Counted in elements; solvers/census/model.py turns them into bytes.
"""

from __future__ import annotations

from dataclasses import dataclass


class LayerKind:
    """Mixer kinds a layer can have; declared once."""

    FULL_ATTENTION = "full_attention"
    SLIDING_ATTENTION = "sliding_attention"
    MLA = "mla"
    LINEAR_ATTENTION = "linear_attention"  # Gated DeltaNet
    KDA = "kda"  # Kimi delta attention: GDN with a per-channel decay, q/k/v short convs
    LIGHTNING = "lightning_attention"  # MiniMax's linear attention: one K^T V state per head
    MAMBA = "mamba"
    MAMBA2 = "mamba2"
    ATTENTION_MAMBA2 = "attention+mamba2"  # Falcon-H1: both mixers side by side, both caches
    MLP = "mlp"  # a layer with no token mixer (Nemotron-H '-' / 'E')

    GROWING_KV = (FULL_ATTENTION, MLA, ATTENTION_MAMBA2)  # KV grows with every token
    ALL = (FULL_ATTENTION, SLIDING_ATTENTION, MLA, LINEAR_ATTENTION, KDA, LIGHTNING, MAMBA, MAMBA2,
           ATTENTION_MAMBA2, MLP)


@dataclass(frozen=True)
class Linear:
    """One weight matrix of a layer (out x in), `count` copies of it when every expert has one.

    Named as the module is named inside its decoder layer (`self_attn.q_proj`, `mlp.experts.*.up_proj`,
    `*` standing for the expert index), because a checkpoint's quantization_config names the modules
    it left unquantized. Its bias, if any, is not part of it: biases stay at the model dtype.
    """

    name: str
    out_features: int
    in_features: int
    count: int = 1
    gate: bool = False  # a router or gate: fp8 checkpoints keep these at the model dtype by default

    @property
    def params(self) -> int:
        return self.count * self.out_features * self.in_features


@dataclass(frozen=True)
class LayerCensus:
    index: int
    kind: str
    weight_params: int  # everything the layer stores: its linears plus norms, biases, convs, ...
    # Elements stored per token by this layer's cache (full, MLA or sliding attention), else 0.
    kv_elements_per_token: int = 0
    # Sliding window: the cache is capped at this many tokens per sequence (a per-slot cost).
    window_tokens: int = 0
    # Per-sequence recurrent residency of linear-attention / mamba layers.
    conv_state_elements: int = 0
    recurrent_state_elements: int = 0
    ffn: str = "dense"  # dense | moe | none
    # The weight matrices among weight_params, which a weight quantization converts.
    linears: tuple[Linear, ...] = ()

    @property
    def grows_with_tokens(self) -> bool:
        return self.kind in LayerKind.GROWING_KV

    @property
    def is_attention(self) -> bool:
        """An attention layer in the operator's sense: its cache grows with context."""
        return self.grows_with_tokens
