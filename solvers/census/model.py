"""The census of a model: per-layer kind and the three prices of every layer (docs/domain.md §2), its weights priced
as stored or as served (`price_weights`).

Prices are kept as element counts and turned into bytes by a dtype at the point of use, because
the KV and state dtypes are the operator's choice, not the config's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from solvers.census.layers import LayerCensus, LayerKind
from solvers.census.quantization import CAST_DTYPES, DEFAULT_BLOCK, WEIGHT_DTYPES, WeightQuantization, from_config
from solvers.dtypes import width
from solvers.errors import CensusError


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


def price_weights(census: ModelCensus, config: dict[str, Any], source: str,
                  weight_dtype: str | None = None) -> ModelCensus:
    """The census with its weights priced as stored (the config's quantization) or as the operator serves
    them (`weight_dtype`, which wins). Every family goes through here: one pricing of quantized weights."""
    if weight_dtype is not None and weight_dtype not in WEIGHT_DTYPES:
        raise CensusError(f"weight dtype {weight_dtype!r}: use one of {', '.join(WEIGHT_DTYPES)}")
    declared = config.get("quantization_config")
    if weight_dtype in CAST_DTYPES:
        # A cast model computes in that dtype too, so the KV and state defaults follow it (an engine's --dtype).
        note = f"weights priced at {weight_dtype} (weight dtype given), not the config's {census.dtype}"
        if declared:
            note += " or its quantization_config"
        return replace(census, dtype=CAST_DTYPES[weight_dtype], quantization=None, notes=(*census.notes, note))
    if weight_dtype == "fp8" and not (isinstance(declared, dict) and declared.get("quant_method") == "fp8"):
        stored = WeightQuantization(DEFAULT_BLOCK, None, "weight_dtype")
    else:  # the checkpoint's own fp8 layout (its block and unconverted modules) wins over the default
        stored = from_config(config, source)
        if stored is None:
            return census
    if any(layer.weight_params and not layer.linears for layer in census.layers):
        raise CensusError(f"family {census.family!r}: the adapter lists no weight matrices for some layers, so their "
                          "fp8 price is unknown")
    quantized = replace(census, quantization=stored)
    total = sum(layer.weight_params for layer in census.layers)
    layer_bytes = sum(quantized.weight_bytes_per_layer())
    kept = ("modules_to_not_convert" if stored.not_converted is not None else "routers and gates")
    note = (f"decoder-layer linears {stored.describe()} ({stored.source}): {layer_bytes / 2**30:.1f} GiB, "
            f"{layer_bytes / total:.4f} bytes/param ({total * 2 / 2**30:.1f} GiB at bf16); {kept}, norms, "
            f"embeddings and lm_head stay {census.dtype}")
    return replace(quantized, notes=(*census.notes, note))
