"""Weight quantization, priced once for every family (docs/domain.md §2: weight bytes).

Two sources, one implementation:
- a checkpoint's `quantization_config`: fine-grained fp8 as Qwen and DeepSeek publish it
  (`{quant_method: fp8, weight_block_size: [128, 128], modules_to_not_convert: [...]}`), or 4-bit weights with
  16-bit activations (W4A16) from GPTQ, AWQ or compressed-tensors' pack-quantized format, and
- the operator's `weight_dtype` (bf16, fp16, fp32 cast the whole model; fp8 quantizes it block-wise).

An fp8 linear stores 1 byte per weight plus one fp32 inverse scale per block of its out x in matrix. A W4A16
linear is priced as the engine holds it (docs/architecture.md, "Quantized weights"), whatever the checkpoint's
packing: 4 bits a weight in int32 words, a scale per group of its inputs at the model dtype, and, when asymmetric,
a 4-bit zero point per group, packed in int32 words along the outputs.
Everything else (norms, biases, convs, embeddings, lm_head, and the modules the checkpoint did not
convert) stays at the model dtype. A quant_method (or a field of one) the engine cannot run is refused, never guessed.
`price_weights` (solvers/census/model.py) picks the source for a census.
"""

from __future__ import annotations

import math
import re
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
    if method in W4A16_METHODS:
        return w4a16_from_config(quant, source)
    if method == "mxfp4":
        return mxfp4_from_config(quant)
    if method != "fp8":
        raise CensusError(
            f"{source}: quantization_config quant_method {method!r} cannot be priced (known: 'fp8', block-scaled; "
            f"4-bit {', '.join(map(repr, W4A16_METHODS))}; 'mxfp4' experts); "
            "state how the weights will be served with --weight-dtype bf16|fp16|fp32|fp8")
    block = quant.get("weight_block_size")
    if block is not None and (len(block) != 2 or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                                     for b in block)):
        raise CensusError(f"{source}: quantization_config weight_block_size must be two positive sizes, "
                          f"e.g. [128, 128] (got {block!r})")
    kept = quant.get("modules_to_not_convert")
    return WeightQuantization(None if block is None else (block[0], block[1]),
                              None if kept is None else tuple(str(entry) for entry in kept), "quantization_config")


# --- 4-bit weights, 16-bit activations (W4A16) ------------------------------------------------------------------

W4A16_METHODS = ("gptq", "awq", "compressed-tensors")
W4A16_BITS = 4
PACK = 32 // W4A16_BITS  # 4-bit values per int32 word
WORD_WIDTH = 4
GPTQ_FORMATS = ("gptq", "gptq_v2")  # v1 stores each zero point minus one; v2 stores it as is


@dataclass(frozen=True, kw_only=True)
class W4A16Quantization(WeightQuantization):
    """4-bit weights in groups of `group_size` inputs (None: one group per row, GPTQ's -1 and the channel
    strategy), a scale per group, and a zero point per group unless `symmetric` (then it is 8). Which linears
    convert follows fp8's rule: the checkpoint's list of unconverted modules (`not_converted`, compressed-tensors'
    `re:` entries as `ignored_patterns`), else every linear but the routers and gates."""

    method: str  # gptq | awq | compressed-tensors
    group_size: int | None
    symmetric: bool
    checkpoint_format: str  # how the checkpoint packs them: gptq, gptq_v2, awq (gemm) or pack-quantized
    ignored_patterns: tuple[str, ...] = ()

    def layer_bytes(self, layer: LayerCensus, rest_width: int) -> int:
        """Packed weights, scales (at `rest_width`, the model dtype) and zero points of the converted linears, and
        the rest of the layer at `rest_width`."""
        converted_params = quantized_bytes = 0
        for linear in layer.linears:
            copies = linear.count - self.kept_copies(layer.index, linear)
            if copies:
                converted_params += copies * linear.out_features * linear.in_features
                quantized_bytes += copies * self.linear_bytes(linear, rest_width)
        return quantized_bytes + (layer.weight_params - converted_params) * rest_width

    def group(self, linear: Linear) -> int:
        """Inputs per group of this linear, refusing a shape the 4-bit layout cannot hold."""
        group = self.group_size or linear.in_features
        problems = [f"in_features {linear.in_features} is not a multiple of {size} ({why})"
                    for size, why in ((PACK, "8 weights a word"), (group, "the group size"))
                    if linear.in_features % size]
        if self.method in ("gptq", "awq") and linear.out_features % PACK:
            problems.append(f"out_features {linear.out_features} is not a multiple of {PACK} ({self.method} packs "
                            "zero points along them)")
        if problems:
            raise CensusError(f"quantization_config {self.method!r}: linear {linear.name} cannot be held in 4 bits: "
                              + "; ".join(problems) + "; list it among the unconverted modules or serve unquantized")
        return group

    def linear_bytes(self, linear: Linear, scale_width: int) -> int:
        """One copy: qweight [out, in / 8] int32, scales [out, groups], zeros [groups, ceil(out / 8)] int32."""
        out, groups = linear.out_features, linear.in_features // self.group(linear)
        zeros = 0 if self.symmetric else groups * math.ceil(out / PACK) * WORD_WIDTH
        return out * linear.in_features // PACK * WORD_WIDTH + out * groups * scale_width + zeros

    def scales(self, linear: Linear) -> int:
        return linear.out_features * (linear.in_features // self.group(linear))

    def kept_copies(self, layer_index: int, linear: Linear) -> int:
        kept = super().kept_copies(layer_index, linear)
        if not self.ignored_patterns or kept == linear.count:
            return kept
        paths = ([f"model.layers.{layer_index}.{linear.name}"] if "*" not in linear.name else
                 [f"model.layers.{layer_index}.{linear.name.replace('*', str(e))}" for e in range(linear.count)])
        matched = sum(any(re.match(pattern, path) for pattern in self.ignored_patterns) for path in paths)
        return linear.count if matched and "*" not in linear.name else max(kept, matched)

    def to_dict(self) -> dict:
        return {"method": self.method, "bits": W4A16_BITS, "group_size": self.group_size,
                "symmetric": self.symmetric, "checkpoint_format": self.checkpoint_format,
                "modules_not_converted": None if self.not_converted is None else
                len(self.not_converted) + len(self.ignored_patterns), "source": self.source}

    def describe(self) -> str:
        group = f"groups of {self.group_size}" if self.group_size else "one group per row"
        zeros = "symmetric" if self.symmetric else "with 4-bit zero points"
        return f"{self.method} 4-bit in {group}, {zeros}"


def w4a16_from_config(quant: dict[str, Any], source: str) -> W4A16Quantization:
    """A GPTQ, AWQ or compressed-tensors quantization_config as the engine will hold it; a field the engine cannot
    run is refused by name."""
    method = quant["quant_method"]
    where = f"{source}: quantization_config quant_method {method!r}"
    if method == "gptq":
        return _gptq(quant, where)
    if method == "awq":
        return _awq(quant, where)
    return _compressed_tensors(quant, where)


def _refuse(where: str, field_name: str, value: Any, why: str) -> CensusError:
    return CensusError(f"{where}: field {field_name!r} is {value!r}; {why}")


def _bits(where: str, field_name: str, value: Any) -> None:
    if value != W4A16_BITS:
        raise _refuse(where, field_name, value, "the engine runs 4-bit weights only")


def _group_size(where: str, field_name: str, value: Any) -> int | None:
    """A positive group size, or None for -1 (one group per row)."""
    if value == -1:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _refuse(where, field_name, value, "a group size is a positive number of inputs, or -1 for one per row")
    return value


def _gptq(quant: dict[str, Any], where: str) -> W4A16Quantization:
    _bits(where, "bits", quant.get("bits"))
    group = _group_size(where, "group_size", quant.get("group_size"))
    if quant.get("desc_act"):
        raise _refuse(where, "desc_act", quant["desc_act"], "act-order permutes each group's inputs (a non-trivial "
                      "g_idx), which the engine's 4-bit layout does not hold; use a checkpoint quantized without it")
    checkpoint_format = quant.get("checkpoint_format", "gptq")
    if checkpoint_format not in GPTQ_FORMATS:
        raise _refuse(where, "checkpoint_format", checkpoint_format, f"the engine reads {' or '.join(GPTQ_FORMATS)}")
    for unsupported in ("dynamic", "modules_in_block_to_quantize"):
        if quant.get(unsupported):
            raise _refuse(where, unsupported, quant[unsupported], "per-module quantization choices are not supported")
    if quant.get("lm_head"):
        raise _refuse(where, "lm_head", quant["lm_head"], "the engine holds lm_head at the model dtype")
    symmetric = quant.get("sym", True)
    if not isinstance(symmetric, bool):
        raise _refuse(where, "sym", symmetric, "sym is true or false")
    kept = quant.get("modules_to_not_convert")
    return W4A16Quantization(block=None, not_converted=None if kept is None else tuple(map(str, kept)),
                             source="quantization_config", method="gptq", group_size=group, symmetric=symmetric,
                             checkpoint_format=checkpoint_format)


def _awq(quant: dict[str, Any], where: str) -> W4A16Quantization:
    bits_field = "bits" if "bits" in quant else "w_bit"
    _bits(where, bits_field, quant.get(bits_field))
    group_field = "group_size" if "group_size" in quant else "q_group_size"
    group = _group_size(where, group_field, quant.get(group_field))
    version = str(quant.get("version", "gemm")).lower()
    if version != "gemm":
        raise _refuse(where, "version", quant.get("version"), "the engine reads AWQ's GEMM packing only")
    if quant.get("zero_point", True) is not True:
        raise _refuse(where, "zero_point", quant.get("zero_point"), "the engine reads AWQ with zero points only")
    kept = quant.get("modules_to_not_convert")
    return W4A16Quantization(block=None, not_converted=None if kept is None else tuple(map(str, kept)),
                             source="quantization_config", method="awq", group_size=group, symmetric=False,
                             checkpoint_format="awq")


def _compressed_tensors(quant: dict[str, Any], where: str) -> W4A16Quantization:
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise _refuse(where, "config_groups", groups, "the engine runs exactly one quantization group")
    (name, scheme), = groups.items()
    scheme = scheme if isinstance(scheme, dict) else {}
    fmt = scheme.get("format") or quant.get("format")
    if fmt != "pack-quantized":
        raise _refuse(where, "format", fmt, "the engine reads 'pack-quantized' (4-bit integers packed in int32)")
    if scheme.get("targets") != ["Linear"]:
        raise _refuse(where, f"config_groups.{name}.targets", scheme.get("targets"), "the engine converts ['Linear']")
    if scheme.get("input_activations") is not None:
        raise _refuse(where, f"config_groups.{name}.input_activations", scheme["input_activations"],
                      "the engine keeps activations at the model dtype (W4A16)")
    weights = scheme.get("weights") if isinstance(scheme.get("weights"), dict) else {}
    field_of = f"config_groups.{name}.weights"
    _bits(where, f"{field_of}.num_bits", weights.get("num_bits"))
    if weights.get("type", "int") != "int":
        raise _refuse(where, f"{field_of}.type", weights.get("type"), "the engine runs 4-bit integers")
    strategy = weights.get("strategy")
    if strategy not in ("group", "channel"):
        raise _refuse(where, f"{field_of}.strategy", strategy, "the engine runs 'group' or 'channel' scales")
    group = _group_size(where, f"{field_of}.group_size", weights.get("group_size")) if strategy == "group" else None
    if weights.get("actorder") == "group":
        raise _refuse(where, f"{field_of}.actorder", "group", "act-order groups (a non-trivial g_idx) are not held "
                      "by the engine's 4-bit layout; use a checkpoint quantized without them")
    if weights.get("dynamic"):
        raise _refuse(where, f"{field_of}.dynamic", weights["dynamic"], "the engine needs stored scales")
    symmetric = weights.get("symmetric", True)
    ignore = [str(entry) for entry in quant.get("ignore") or ()]
    patterns = tuple(entry[3:] for entry in ignore if entry.startswith("re:"))
    plain = tuple(entry for entry in ignore if not entry.startswith("re:"))
    return W4A16Quantization(block=None, not_converted=None if quant.get("ignore") is None else plain,
                             source="quantization_config", method="compressed-tensors", group_size=group,
                             symmetric=bool(symmetric), checkpoint_format="pack-quantized", ignored_patterns=patterns)


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
