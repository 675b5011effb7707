"""Weight quantization, priced once for every family (docs/domain.md §2: weight bytes).

Two sources, one implementation:
- a checkpoint's `quantization_config` (fine-grained fp8 as Qwen and DeepSeek publish it:
  `{quant_method: fp8, weight_block_size: [128, 128], modules_to_not_convert: [...]}`), and
- the operator's `weight_dtype` (bf16, fp16, fp32 cast the whole model; fp8 quantizes it block-wise).

An fp8 linear stores 1 byte per weight plus one fp32 inverse scale per block of its out x in matrix.
Everything else (norms, biases, convs, embeddings, lm_head, and the modules the checkpoint did not
convert) stays at the model dtype. A quant_method this module does not know is refused, never guessed.
`price_weights` (solvers/census/model.py) picks the source for a census.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from solvers.census.layers import LayerCensus, Linear
from solvers.errors import CensusError

WEIGHT_DTYPES = ("bf16", "fp16", "fp32", "fp8")
CAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # weight dtypes that cast the whole model
FP8_WIDTH = 1
SCALE_WIDTH = 4  # fine-grained fp8 checkpoints keep each block's inverse scale (weight_scale_inv) in fp32
DEFAULT_BLOCK = (128, 128)  # what `weight_dtype fp8` assumes: the block Qwen and DeepSeek publish
_ALL = "*"  # a not-converted entry that names every copy of a linear, not one expert's


@dataclass(frozen=True)
class WeightQuantization:
    """fp8 weights for the decoder layers' linears, with a scale per block (or per matrix)."""

    block: tuple[int, int] | None  # (out, in) block of one scale; None: one scale per matrix
    # The checkpoint's modules_to_not_convert; None when it gives none: then routers and gates stay
    # unquantized (as DeepSeek-V3 and Qwen's fp8 checkpoints keep them) and every other linear converts.
    not_converted: tuple[str, ...] | None
    source: str  # "quantization_config" or "weight_dtype"
    # not_converted split once (a published list names every layer's modules, hundreds of entries):
    # layer index -> module paths inside that layer, and bare module names that match in any layer.
    _in_layer: dict[int, list[list[str]]] = field(init=False, repr=False, compare=False)
    _anywhere: list[list[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        in_layer: dict[int, list[list[str]]] = {}
        anywhere: list[list[str]] = []
        for entry in self.not_converted or ():
            # Entries match whole dotted components, as module paths do: a path from the model
            # (`model.layers.3.mlp.gate`, whatever precedes `layers`) or a bare module name (`mlp.gate`).
            parts = entry.split(".")
            if "layers" not in parts:
                anywhere.append(parts)
                continue
            parts = parts[parts.index("layers"):]
            if len(parts) > 1 and parts[1].isdigit():
                in_layer.setdefault(int(parts[1]), []).append(parts[2:])
            else:  # `model.layers` alone, or no layer index: every layer
                anywhere.append(parts[2:])
        object.__setattr__(self, "_in_layer", in_layer)
        object.__setattr__(self, "_anywhere", anywhere)

    def layer_bytes(self, layer: LayerCensus, rest_width: int) -> int:
        """fp8 bytes + scales of the converted linears, and the rest of the layer at `rest_width`."""
        converted_params = quantized_bytes = 0
        for linear in layer.linears:
            copies = linear.count - self.kept_copies(layer.index, linear)
            converted_params += copies * linear.out_features * linear.in_features
            quantized_bytes += copies * (linear.out_features * linear.in_features * FP8_WIDTH
                                         + SCALE_WIDTH * self.scales(linear))
        return quantized_bytes + (layer.weight_params - converted_params) * rest_width

    def scales(self, linear: Linear) -> int:
        if self.block is None:
            return 1
        return math.ceil(linear.out_features / self.block[0]) * math.ceil(linear.in_features / self.block[1])

    def kept_copies(self, layer_index: int, linear: Linear) -> int:
        """How many of the linear's copies stay at the model dtype."""
        if self.not_converted is None:
            return linear.count if linear.gate else 0
        path = linear.name.split(".")
        bound = [_bind(parts, path) for parts in self._in_layer.get(layer_index, ())]
        bound += [_bind(parts, path[start:]) for parts in self._anywhere for start in range(len(path))]
        if _ALL in bound:
            return linear.count
        return len({expert for expert in bound if expert is not None})

    def to_dict(self) -> dict:
        return {"method": "fp8", "block": None if self.block is None else list(self.block),
                "scale_bytes": SCALE_WIDTH, "modules_not_converted": None if self.not_converted is None
                else len(self.not_converted), "source": self.source}

    def describe(self) -> str:
        block = f"{self.block[0]}x{self.block[1]} block scales" if self.block else "one scale per matrix"
        return f"fp8 with {block}"


def _bind(parts: list[str], path: list[str]) -> str | None:
    """`parts` as a prefix of `path`: None if not, else the expert index a `*` in the path took, or _ALL."""
    if len(parts) > len(path):
        return None
    expert = _ALL
    for part, component in zip(parts, path, strict=False):
        if component == "*" and part.isdigit():
            expert = part
        elif part != component:
            return None
    return expert


def from_config(config: dict[str, Any], source: str) -> WeightQuantization | None:
    """The checkpoint's quantization_config, or None; an unknown quant_method is refused naming it."""
    quant = config.get("quantization_config")
    if not quant:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method == "mxfp4":
        return mxfp4_from_config(quant)
    if method != "fp8":
        raise CensusError(
            f"{source}: quantization_config quant_method {method!r} cannot be priced (known: 'fp8', block-scaled); "
            "state how the weights will be served with --weight-dtype bf16|fp16|fp32|fp8")
    block = quant.get("weight_block_size")
    if block is not None and (len(block) != 2 or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                                     for b in block)):
        raise CensusError(f"{source}: quantization_config weight_block_size must be two positive sizes, "
                          f"e.g. [128, 128] (got {block!r})")
    kept = quant.get("modules_to_not_convert")
    return WeightQuantization(None if block is None else (block[0], block[1]),
                              None if kept is None else tuple(str(entry) for entry in kept), "quantization_config")


# --- MXFP4 experts (gpt-oss) ---------------------------------------------------------------------------------------
MXFP4_BLOCK = 32  # weights per scale, along the input dimension
MXFP4_BLOCK_BYTES = MXFP4_BLOCK // 2 + 1  # 16 bytes of packed 4-bit values + one uint8 e8m0 scale


@dataclass(frozen=True)
class Mxfp4Quantization(WeightQuantization):
    """MXFP4 experts as gpt-oss publishes them (quant_method "mxfp4"): every expert matrix is stored as
    `*_blocks` uint8 [E, out, in/32, 16] (two 4-bit values a byte) and `*_scales` uint8 [E, out, in/32] (one
    e8m0 scale per 32 weights). Only expert matrices convert, as transformers' Mxfp4 integration replaces the
    experts alone; modules_to_not_convert keeps more of them at the model dtype, and expert biases stay there."""

    def layer_bytes(self, layer: LayerCensus, rest_width: int) -> int:
        converted_params = quantized_bytes = 0
        for linear in layer.linears:
            if ".experts." not in f".{linear.name}.":
                continue
            copies = linear.count - self.kept_copies(layer.index, linear)
            converted_params += copies * linear.out_features * linear.in_features
            quantized_bytes += copies * linear.out_features * math.ceil(linear.in_features / MXFP4_BLOCK) \
                * MXFP4_BLOCK_BYTES
        return quantized_bytes + (layer.weight_params - converted_params) * rest_width

    def to_dict(self) -> dict:
        return {"method": "mxfp4", "block": [1, MXFP4_BLOCK], "scale_bytes": 1, "modules_not_converted": None
                if self.not_converted is None else len(self.not_converted), "source": self.source}

    def describe(self) -> str:
        return f"of the experts in mxfp4 (4-bit, one e8m0 scale per {MXFP4_BLOCK} weights; other linears unconverted)"


def mxfp4_from_config(quant: dict[str, Any]) -> Mxfp4Quantization:
    kept = quant.get("modules_to_not_convert")
    return Mxfp4Quantization((1, MXFP4_BLOCK), None if kept is None else tuple(str(entry) for entry in kept),
                             "quantization_config")
