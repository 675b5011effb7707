"""The census of a model: per-layer kind and the three prices of every layer (docs/domain.md §2).

Prices are kept as element counts and turned into bytes by a dtype at the point of use, because
the KV and state dtypes are the operator's choice, not the config's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from solvers.dtypes import width

if TYPE_CHECKING:  # quantization prices layers, so it imports this module, not the other way round
    from solvers.census.quantization import WeightQuantization


class LayerKind:
    """Mixer kinds a layer can have; declared once."""

    FULL_ATTENTION = "full_attention"
    SLIDING_ATTENTION = "sliding_attention"
    MLA = "mla"
    LINEAR_ATTENTION = "linear_attention"  # Gated DeltaNet
    MAMBA = "mamba"
    MAMBA2 = "mamba2"
    MLP = "mlp"  # a layer with no token mixer (Nemotron-H '-' / 'E')

    GROWING_KV = (FULL_ATTENTION, MLA)  # KV grows with every token
    ALL = (FULL_ATTENTION, SLIDING_ATTENTION, MLA, LINEAR_ATTENTION, MAMBA, MAMBA2, MLP)


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


@dataclass(frozen=True)
class ModelCensus:
    family: str
    model_type: str
    dtype: str  # the weights' dtype, and the default state dtype
    layers: tuple[LayerCensus, ...]
    embedding_params: int
    lm_head_params: int  # 0 when tied to the embeddings
    final_norm_params: int
    hidden_size: int
    vocab_size: int
    intermediate_size: int  # widest FFN activation, for workspace estimates
    max_position_embeddings: int | None = None
    name: str | None = None
    # How the decoder layers' linear weights are stored when not at `dtype` (an fp8 checkpoint).
    quantization: WeightQuantization | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    # --- shape of the model -------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def tied_embeddings(self) -> bool:
        return self.lm_head_params == 0

    @property
    def layer_kinds(self) -> list[str]:
        return [layer.kind for layer in self.layers]

    @property
    def attention_layers(self) -> list[int]:
        """Indices of layers whose KV grows with tokens."""
        return [layer.index for layer in self.layers if layer.grows_with_tokens]

    # --- prices ---------------------------------------------------------------------------
    @property
    def weight_width(self) -> float:
        """Bytes per decoder-layer parameter: the dtype's width, or the average under a quantization."""
        if self.quantization is None:
            return width(self.dtype)
        return sum(self.weight_bytes_per_layer()) / sum(layer.weight_params for layer in self.layers)

    def layer_weight_bytes(self, index: int) -> int:
        layer = self.layers[index]
        if self.quantization is None:
            return layer.weight_params * width(self.dtype)
        return self.quantization.layer_bytes(layer, width(self.dtype))

    def weight_bytes_per_layer(self) -> list[int]:
        return [self.layer_weight_bytes(layer.index) for layer in self.layers]

    @property
    def embedding_bytes(self) -> int:
        return self.embedding_params * width(self.dtype)

    @property
    def head_bytes(self) -> int:
        """Final norm + untied lm_head: they live on the last rank."""
        return (self.lm_head_params + self.final_norm_params) * width(self.dtype)

    @property
    def weight_bytes_total(self) -> int:
        return sum(self.weight_bytes_per_layer()) + self.embedding_bytes + self.head_bytes

    def layer_kv_bytes_per_token(self, index: int, kv_dtype: str | None = None) -> int:
        """Bytes per token for a layer whose KV grows with tokens (0 for every other layer)."""
        layer = self.layers[index]
        if not layer.grows_with_tokens:
            return 0
        return layer.kv_elements_per_token * width(kv_dtype or self.dtype)

    def kv_bytes_per_token(self, kv_dtype: str | None = None, layers: range | None = None) -> int:
        """Bytes per token over `layers` (all layers by default), growing-KV layers only."""
        indices = layers if layers is not None else range(self.num_layers)
        return sum(self.layer_kv_bytes_per_token(i, kv_dtype) for i in indices)

    def layer_state_bytes_per_sequence(
        self, index: int, state_dtype: str | None = None, kv_dtype: str | None = None,
        max_model_len: int | None = None,
    ) -> int:
        """Per-sequence residency: conv + recurrent state, or a sliding window's capped KV."""
        layer = self.layers[index]
        state = (layer.conv_state_elements + layer.recurrent_state_elements) * width(state_dtype or self.dtype)
        if layer.kind == LayerKind.SLIDING_ATTENTION:
            window = layer.window_tokens if max_model_len is None else min(layer.window_tokens, max_model_len)
            state += window * layer.kv_elements_per_token * width(kv_dtype or self.dtype)
        return state

    def state_bytes_per_sequence(
        self, state_dtype: str | None = None, kv_dtype: str | None = None,
        layers: range | None = None, max_model_len: int | None = None,
    ) -> int:
        indices = layers if layers is not None else range(self.num_layers)
        return sum(
            self.layer_state_bytes_per_sequence(i, state_dtype, kv_dtype, max_model_len) for i in indices
        )

    def summary(self, kv_dtype: str | None = None, state_dtype: str | None = None) -> dict:
        """The census as the CLI's --json contract states it."""
        return {
            "name": self.name,
            "family": self.family,
            "model_type": self.model_type,
            "dtype": self.dtype,
            "weight_quantization": None if self.quantization is None else self.quantization.to_dict(),
            "kv_dtype": kv_dtype or self.dtype,
            "state_dtype": state_dtype or self.dtype,
            "num_layers": self.num_layers,
            "layer_kinds": self.layer_kinds,
            "attention_layers": self.attention_layers,
            "kv_bytes_per_token": self.kv_bytes_per_token(kv_dtype),
            "state_bytes_per_sequence": self.state_bytes_per_sequence(state_dtype, kv_dtype),
            "weight_bytes_total": self.weight_bytes_total,
            "weight_bytes_per_layer": self.weight_bytes_per_layer(),
            "embedding_bytes": self.embedding_bytes,
            "head_bytes": self.head_bytes,
            "tied_embeddings": self.tied_embeddings,
            "notes": list(self.notes),
        }
