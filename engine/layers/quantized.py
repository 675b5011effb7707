"""Linears whose weights stay quantized in memory, and how each is read from its checkpoint format.

A decoder layer asks `Linears` for each projection: a plain nn.Linear, or the quantized module the census prices for
it (solvers/census/quantization.py decides which linears convert, so the engine holds exactly what the planner
priced). Two modules hold the canonical layouts of engine/ops/quantized.py: `FP8BlockLinear` (weight,
weight_scale_inv) and `W4A16Linear` (qweight, scales, qzeros); either may hold a stack of experts (a leading
dimension E, one slice per routed expert). Their tensors are ordinary parameters, so the host image, the slab, the
checksums and the memory accounting treat them like any other weight.

Each module also carries its own checkpoint reading (`checkpoint_plan`): the checkpoint tensors each parameter is made
of, the repacking into the canonical layout (GPTQ's [K/8, N] transposed and its v1 zero points plus one; AWQ's
interleaved words put in order; compressed-tensors' zero points transposed), and the checks on values the layout
cannot hold (an act-order g_idx, a symmetric checkpoint whose zero points are not 8), run before any weight is filled.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from engine.config import ModelConfig
from engine.errors import EngineConfigError
from engine.ops.linear import linear
from engine.ops.quantized import NIBBLES, fp8_block_linear, pack_int4, unpack_int4, w4a16_linear
from solvers.census import Linear
from solvers.census.quantization import W4A16Quantization, WeightQuantization

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ's GEMM packing: nibble i of a word holds column 8 j + AWQ_ORDER[i]
_AWQ_COLUMNS = [AWQ_ORDER.index(i) for i in range(NIBBLES)]  # the nibble holding each column


@dataclass
class TensorSource:
    """How one parameter is made from checkpoint tensors."""

    names: list[str]
    shapes: list[tuple[int, ...]]
    combine: Callable[[list[torch.Tensor]], torch.Tensor] = lambda tensors: tensors[0]


@dataclass
class TensorCheck:
    """A checkpoint tensor read only to be checked (a g_idx, zero points the layout drops); `problem` says what is
    wrong with its value, or None."""

    name: str
    shape: tuple[int, ...]
    problem: Callable[[torch.Tensor], str | None]
    required: bool = True


@dataclass
class CheckpointPlan:
    sources: dict[str, TensorSource] = field(default_factory=dict)  # parameter name (in the module) -> source
    checks: list[TensorCheck] = field(default_factory=list)


def _stack(combine: Callable[[torch.Tensor], torch.Tensor], experts: int
           ) -> Callable[[list[torch.Tensor]], torch.Tensor]:
    """One tensor repacked, or E tensors (one per expert) each repacked, then stacked."""
    if not experts:
        return lambda tensors: combine(tensors[0])
    return lambda tensors: torch.stack([combine(t) for t in tensors])


class QuantizedLinear(nn.Module):
    """What the two layouts share: sizes, an optional bias, an optional expert stack, and the checkpoint names."""

    def __init__(self, in_features: int, out_features: int, bias: bool, experts: int):
        super().__init__()
        self.in_features, self.out_features, self.experts = in_features, out_features, experts
        self.lead = (experts,) if experts else ()
        self.bias = nn.Parameter(torch.empty(*self.lead, out_features), requires_grad=False) if bias else None

    def _names(self, prefix: str, leaf: str) -> list[str]:
        """Checkpoint names of a leaf: `prefix.leaf`, or one per expert (`prefix` then holds `*`)."""
        if not self.experts:
            return [f"{prefix}.{leaf}"]
        return [f"{prefix.replace('*', str(e))}.{leaf}" for e in range(self.experts)]

    def _source(self, plan: CheckpointPlan, param: str, prefix: str, leaf: str, shape: tuple[int, ...],
                repack: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> None:
        names = self._names(prefix, leaf)
        plan.sources[param] = TensorSource(names, [shape] * len(names), _stack(repack, self.experts))

    def _check(self, plan: CheckpointPlan, prefix: str, leaf: str, shape: tuple[int, ...],
               problem: Callable[[torch.Tensor], str | None], required: bool = True) -> None:
        plan.checks += [TensorCheck(name, shape, problem, required) for name in self._names(prefix, leaf)]

    def _bias_plan(self, plan: CheckpointPlan, prefix: str) -> None:
        if self.bias is not None:
            self._source(plan, "bias", prefix, "bias", (self.out_features,))

    def _bias(self, expert: int | None) -> torch.Tensor | None:
        if self.bias is None:
            return None
        return self.bias if expert is None else self.bias[expert]


class FP8BlockLinear(QuantizedLinear):
    """weight float8_e4m3fn [N, K] and its fp32 inverse scale per (bn x bk) block; checkpoint names as stored."""

    stored_dtypes = {"weight": torch.float8_e4m3fn, "weight_scale_inv": torch.float32}  # kept by build_model's cast

    def __init__(self, in_features: int, out_features: int, block: tuple[int, int], bias: bool = False,
                 experts: int = 0):
        super().__init__(in_features, out_features, bias, experts)
        self.block = block
        scale_shape = (math.ceil(out_features / block[0]), math.ceil(in_features / block[1]))
        self.weight = nn.Parameter(torch.empty(*self.lead, out_features, in_features, dtype=torch.float8_e4m3fn),
                                   requires_grad=False)
        self.weight_scale_inv = nn.Parameter(torch.empty(*self.lead, *scale_shape, dtype=torch.float32),
                                             requires_grad=False)

    def forward(self, x: torch.Tensor, expert: int | None = None) -> torch.Tensor:
        weight, scale_inv = ((self.weight, self.weight_scale_inv) if expert is None
                             else (self.weight[expert], self.weight_scale_inv[expert]))
        y = fp8_block_linear(x, weight, scale_inv, self.block)
        bias = self._bias(expert)
        return y if bias is None else y + bias

    def checkpoint_plan(self, prefix: str, checkpoint_format: str) -> CheckpointPlan:
        plan = CheckpointPlan()
        self._source(plan, "weight", prefix, "weight", tuple(self.weight.shape[-2:]))
        self._source(plan, "weight_scale_inv", prefix, "weight_scale_inv", tuple(self.weight_scale_inv.shape[-2:]))
        self._bias_plan(plan, prefix)
        return plan


class W4A16Linear(QuantizedLinear):
    """qweight int32 [N, K / 8], scales [N, K / G] (the model dtype), qzeros int32 [K / G, ceil(N / 8)] unless
    symmetric (engine/ops/quantized.py)."""

    def __init__(self, in_features: int, out_features: int, group_size: int, symmetric: bool, bias: bool = False,
                 experts: int = 0):
        super().__init__(in_features, out_features, bias, experts)
        self.group_size, self.groups = group_size, in_features // group_size
        self.qweight = nn.Parameter(torch.empty(*self.lead, out_features, in_features // NIBBLES, dtype=torch.int32),
                                    requires_grad=False)
        self.scales = nn.Parameter(torch.empty(*self.lead, out_features, self.groups), requires_grad=False)
        self.qzeros = None if symmetric else nn.Parameter(
            torch.empty(*self.lead, self.groups, math.ceil(out_features / NIBBLES), dtype=torch.int32),
            requires_grad=False)

    def forward(self, x: torch.Tensor, expert: int | None = None) -> torch.Tensor:
        qweight, scales, qzeros = self.qweight, self.scales, self.qzeros
        if expert is not None:
            qweight, scales = qweight[expert], scales[expert]
            qzeros = None if qzeros is None else qzeros[expert]
        y = w4a16_linear(x, qweight, scales, qzeros, self.group_size)
        bias = self._bias(expert)
        return y if bias is None else y + bias

    def checkpoint_plan(self, prefix: str, checkpoint_format: str) -> CheckpointPlan:
        reader = {"gptq": self._gptq, "gptq_v2": self._gptq, "awq": self._awq, "pack-quantized": self._packed}
        plan = CheckpointPlan()
        reader[checkpoint_format](plan, prefix, checkpoint_format == "gptq")
        self._bias_plan(plan, prefix)
        return plan

    def _zeros_plan(self, plan: CheckpointPlan, prefix: str, leaf: str, shape: tuple[int, ...],
                    natural: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """The zero points, `natural` turning the stored tensor into z [K / G, N] (0..15): kept packed along N, or
        for a symmetric layout checked to be 8 and dropped."""
        if self.qzeros is not None:
            self._source(plan, "qzeros", prefix, leaf, shape, lambda t: pack_int4(natural(t)))
            return
        self._check(plan, prefix, leaf, shape, lambda t: None if bool((natural(t) == 8).all()) else
                    "a symmetric checkpoint's zero points must all be 8 (the engine drops them)")

    def _trivial_g_idx(self, g_idx: torch.Tensor) -> str | None:
        expected = torch.arange(self.in_features) // self.group_size
        return None if torch.equal(g_idx.long(), expected) else (
            "g_idx is not arange(in_features) // group_size: act-order groups, which the engine's layout cannot "
            "hold; use a checkpoint quantized without desc_act / actorder")

    def _gptq(self, plan: CheckpointPlan, prefix: str, minus_one: bool) -> None:
        """GPTQ: qweight [K / 8, N] packed along K (its transpose is the canonical layout), scales [K / G, N], qzeros
        [K / G, N / 8] packed along N, stored minus one in the v1 format ('gptq'), and g_idx [K]."""
        n, k, groups = self.out_features, self.in_features, self.groups
        self._source(plan, "qweight", prefix, "qweight", (k // NIBBLES, n), lambda t: t.t().contiguous())
        self._source(plan, "scales", prefix, "scales", (groups, n), lambda t: t.t().contiguous())

        def natural(stored: torch.Tensor) -> torch.Tensor:
            return unpack_int4(stored, n) + int(minus_one)

        if minus_one and self.qzeros is not None:
            self._check(plan, prefix, "qzeros", (groups, n // NIBBLES), lambda t: None if bool(
                (unpack_int4(t, n) < 15).all()) else "a GPTQ v1 zero point stored as 15 means 16, which 4 bits "
                "cannot hold")
        self._zeros_plan(plan, prefix, "qzeros", (groups, n // NIBBLES), natural)
        self._check(plan, prefix, "g_idx", (k,), self._trivial_g_idx, required=False)

    def _awq(self, plan: CheckpointPlan, prefix: str, _: bool) -> None:
        """AWQ (GEMM): qweight [K, N / 8] and qzeros [K / G, N / 8] packed along N in AWQ_ORDER, scales [K / G, N]."""
        n, k, groups = self.out_features, self.in_features, self.groups

        def in_order(stored: torch.Tensor) -> torch.Tensor:  # [rows, N / 8] -> [rows, N] values, columns in order
            values = unpack_int4(stored, n).unflatten(-1, (-1, NIBBLES))
            return values[..., _AWQ_COLUMNS].flatten(-2)

        self._source(plan, "qweight", prefix, "qweight", (k, n // NIBBLES), lambda t: pack_int4(in_order(t).t()))
        self._source(plan, "scales", prefix, "scales", (groups, n), lambda t: t.t().contiguous())
        self._zeros_plan(plan, prefix, "qzeros", (groups, n // NIBBLES), in_order)

    def _packed(self, plan: CheckpointPlan, prefix: str, _: bool) -> None:
        """compressed-tensors pack-quantized: weight_packed [N, K / 8] (canonical already: signed values stored plus
        8), weight_scale [N, K / G], weight_zero_point [ceil(N / 8), K / G] packed along N when asymmetric,
        weight_shape [2] and an optional weight_g_idx [K]."""
        n, k, groups = self.out_features, self.in_features, self.groups
        self._source(plan, "qweight", prefix, "weight_packed", (n, k // NIBBLES))
        self._source(plan, "scales", prefix, "weight_scale", (n, groups))
        if self.qzeros is not None:
            self._source(plan, "qzeros", prefix, "weight_zero_point", (math.ceil(n / NIBBLES), groups),
                         lambda t: t.t().contiguous())
        self._check(plan, prefix, "weight_shape", (2,), lambda t: None if t.tolist() == [n, k] else
                    f"weight_shape {t.tolist()} is not [{n}, {k}]")
        self._check(plan, prefix, "weight_g_idx", (k,), self._trivial_g_idx, required=False)


class Linears:
    """Makes one decoder layer's linears, by their census names (`self_attn.q_proj`, `mlp.experts.*.up_proj`): an
    nn.Linear, or the quantized module of the census' quantization for the ones it converts."""

    def __init__(self, config: ModelConfig, layer_index: int, prefix: str = ""):
        self.config, self.layer_index, self.prefix = config, layer_index, prefix
        self.quantization: WeightQuantization | None = config.census.quantization

    def scoped(self, prefix: str) -> Linears:
        return Linears(self.config, self.layer_index, f"{self.prefix}{prefix}.")

    def __call__(self, name: str, in_features: int, out_features: int, bias: bool = False) -> nn.Module:
        return self.quantized(name, in_features, out_features, bias) or nn.Linear(in_features, out_features, bias)

    def quantized(self, name: str, in_features: int, out_features: int, bias: bool = False,
                  experts: int = 0) -> QuantizedLinear | None:
        """The quantized module for a converted linear, or None for one kept at the model dtype."""
        if self.quantization is None:
            return None
        linear = self._census_linear(f"{self.prefix}{name}")
        kept = self.quantization.kept_copies(self.layer_index, linear)
        if kept == linear.count:
            return None
        if kept:
            raise EngineConfigError(
                f"{self.config.source}: layer {self.layer_index} keeps {kept} of {linear.count} copies of "
                f"{linear.name} unquantized; the engine converts all of a linear's experts or none")
        quantization = self.quantization
        if type(quantization) not in (WeightQuantization, W4A16Quantization):  # e.g. gpt-oss' mxfp4 experts
            raise EngineConfigError(f"{self.config.source}: weights {quantization.describe()} are priced but the "
                                    "engine runs fp8 block-scaled and 4-bit GPTQ, AWQ or compressed-tensors only")
        if isinstance(quantization, W4A16Quantization):
            return W4A16Linear(in_features, out_features, quantization.group(linear), quantization.symmetric, bias,
                               experts)
        if quantization.block is None:
            raise EngineConfigError(f"{self.config.source}: quantization_config has no weight_block_size; the engine "
                                    "runs block-scaled fp8 (e.g. [128, 128])")
        return FP8BlockLinear(in_features, out_features, quantization.block, bias, experts)

    def _census_linear(self, name: str) -> Linear:
        for census_linear in self.config.census.layers[self.layer_index].linears:
            if census_linear.name == name:
                return census_linear
        raise EngineConfigError(f"{self.config.source}: the census of layer {self.layer_index} lists no linear "
                                f"{name}, so its quantization is unknown")


def project(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x through a projection: an nn.Linear on engine/ops/linear.py's path (the GEMV at batch 1 on CUDA), a quantized
    one through its own matmul."""
    if isinstance(module, QuantizedLinear):
        return module(x)
    return linear(x, module.weight, module.bias)


def checkpoint_format(quantization: WeightQuantization) -> str:
    """How the checkpoint packs a quantized linear: fp8, gptq, gptq_v2, awq or pack-quantized."""
    return quantization.checkpoint_format if isinstance(quantization, W4A16Quantization) else "fp8"


def keep_stored_dtypes(model: nn.Module) -> None:
    """Undo a model-wide dtype cast on the tensors whose dtype is their format (fp8 weights, fp32 scales): call on
    the meta device, where it moves no data."""
    for module in model.modules():
        for name, dtype in getattr(module, "stored_dtypes", {}).items():
            param = getattr(module, name)
            if param.dtype != dtype:
                param.data = param.data.to(dtype)
