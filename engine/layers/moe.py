"""Sparse MoE FFN: softmax router, top-k (optionally renormalised), routed experts and a sigmoid-gated shared expert.

Expert weights are held fused as 3-D tensors (gate and up stacked), the layout transformers keeps in memory;
the loader builds them from either checkpoint layout (per-expert tensors or fused).
On CUDA in half precision the routed experts run as two fused Triton grouped GEMMs (engine/ops/triton_moe.py: SiLU·mul
and the routing weights inside them; at decode sizes the routing and the sort by expert are one or two more launches,
engine/ops/triton_route.py), and the layer returns the weighted parts [tokens, slots, hidden] unsummed: the next
RMSNorm (or the range end) sums them as it reads them (engine/layers/norm.py). Without Triton, bf16 runs two torch
grouped matmuls over the pairs sorted by expert. Both make no host synchronisation (a decode step can be captured in a
CUDA graph) and read only the experts hit. Elsewhere each hit expert runs once on its tokens (the reference path).
`SparseMoE.merge_projections()` stacks the router and the shared-expert gate into one [E + 1, H] tensor: one GEMV
serves both. A shared expert of the routed experts' size is also stacked as expert E: the expert tensors' storage
becomes [E + 1, ...] and every parameter, the shared expert's included, a view of it (engine/layers/merge.py). The
Triton path then runs it as one more routed slot a token, weighted by sigmoid(its gate's logit). At decode sizes, with
a router small enough (Qwen3-Next's [33, 2048]), the routing kernels compute the logits themselves from x and the merged
weight (`SparseMoE.kernel_router`): the GEMV's partials over hidden chunks in one launch, summed by the routing launch;
so a layer is those two launches (three past one tile of tokens) and the two GEMMs. There the layer's pre-norm can
ride in the partials' launch too (`SparseMoE.forward_with_norm`, which DecoderLayer calls: residual + mixer output and
its norm computed there, engine/ops/triton_router.py), one launch fewer a layer. A larger router keeps its cuBLAS
GEMV; a shared expert of another shape (or an unmerged layer's) runs as its own GatedMLP, its gate's logit from the
GEMV.
Quantized experts (engine/layers/quantized.py) are `QuantizedExperts`: gate, up and down each a stack of E. On CUDA in
half precision they run the same two grouped GEMMs over their quantized tiles (engine/ops/triton_moe_quant.py, the
routing kernels at decode sizes), so a decode step through them captures in a CUDA graph; elsewhere the reference
loop. A shared expert quantized as they are rides in those kernels as slot E (read from its own tensors, nothing
stacked) once the router and the shared gate are merged; a quantized gate is never merged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import EngineConfigError
from engine.layers.merge import stack_experts, stack_rows
from engine.layers.mlp import GatedMLP, silu_mul
from engine.layers.norm import RMSNorm
from engine.layers.quantized import FP8BlockLinear, Linears, QuantizedLinear
from engine.ops.fused import fused

try:
    from engine.ops.triton_moe import fused_experts, routed_experts
    from engine.ops.triton_moe_quant import (
        Fp8Experts,
        QuantExperts,
        W4Experts,
        quant_fused_experts,
        quant_routed_experts,
    )
    from engine.ops.triton_route import fits_routing_kernels
    from engine.ops.triton_router import fits_router_gemv, normed_router_partials
except ImportError:  # no Triton (CPU-only installs): grouped_mm on CUDA bf16, the loop elsewhere
    fused_experts = routed_experts = fits_router_gemv = fits_routing_kernels = normed_router_partials = None
    quant_fused_experts = quant_routed_experts = None

_grouped_mm = getattr(F, "grouped_mm", None) or torch._grouped_mm


class Experts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        # gate rows first, then up rows, as transformers stacks them.
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        # Plain attributes (not parameters), set by stack_shared(): [E + 1, ...] with the shared expert as expert E;
        # the parameters above are then views of their first E experts.
        self.gate_up_with_shared: torch.Tensor | None = None
        self.down_with_shared: torch.Tensor | None = None

    def stack_shared(self, shared: GatedMLP) -> None:
        """Hold `shared` (of one expert's shape, no biases) as expert E of the [E + 1, ...] tensors the Triton path
        runs; every parameter, `shared`'s included, becomes a view of them, and so does its merged gate_up."""
        self.gate_up_with_shared = stack_experts(
            self.gate_up_proj, [shared.gate_proj.weight, shared.up_proj.weight], self.gate_up_with_shared)
        self.down_with_shared = stack_experts(self.down_proj, [shared.down_proj.weight], self.down_with_shared)
        shared.gate_up_weight = self.gate_up_with_shared[-1]  # its own merge then finds its rows stacked: kept

    @property
    def has_shared_slot(self) -> bool:
        return self.gate_up_with_shared is not None

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The torch paths: x [tokens, hidden]; expert_ids, weights [tokens, top_k] -> [tokens, hidden]."""
        if x.is_cuda and x.dtype == torch.bfloat16:
            return self.grouped(x, expert_ids, weights)
        return self.looped(x, expert_ids, weights)

    def runs_triton(self, x: torch.Tensor) -> bool:
        """Whether the routed experts run as the Triton kernels: CUDA, half precision, Triton installed."""
        half = x.dtype in (torch.bfloat16, torch.float16) and self.gate_up_proj.dtype == x.dtype
        return x.is_cuda and half and fused_experts is not None

    def routes_in_kernels(self, x: torch.Tensor, top_k: int) -> bool:
        """Whether routing and alignment run as the Triton routing kernels (decode-sized batches on the Triton path)."""
        return self.runs_triton(x) and fits_routing_kernels(x.shape[0], self.num_experts, top_k)

    def triton_parts(self, x: torch.Tensor, top_k: int, norm_topk_prob: bool, logits: torch.Tensor | None = None,
                     router_weight: torch.Tensor | None = None, partials: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """The Triton path from the router's logits [tokens, E] (more columns are ignored, but with the shared slot
        column E is the shared gate's logit), or from x and `router_weight` (SparseMoE.kernel_router's: the routing
        kernel computes the logits; from `partials` when made already) -> the weighted parts [tokens, slots, hidden]:
        top_k routed, then the shared expert's when it is slot E. The routing kernels route and align at decode
        sizes, else route + align."""
        num_experts, shared = self.num_experts, self.has_shared_slot
        gate_up, down = ((self.gate_up_with_shared, self.down_with_shared) if shared
                         else (self.gate_up_proj, self.down_proj))
        if router_weight is not None:
            return routed_experts(x, top_k, norm_topk_prob, gate_up, down, router_weight=router_weight,
                                  partials=partials, shared=shared)
        if self.routes_in_kernels(x, top_k):
            return routed_experts(x, top_k, norm_topk_prob, gate_up, down, logits=logits[:, :num_experts + shared],
                                  shared=shared)
        expert_ids, weights = route(logits[:, :num_experts], top_k, norm_topk_prob)
        if shared:
            expert_ids, weights = with_shared_slot(expert_ids, weights, logits[:, num_experts:num_experts + 1],
                                                   num_experts)
        return fused_experts(x, expert_ids, weights, gate_up, down)

    def grouped(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Every (token, expert) pair sorted by expert, then one grouped matmul per projection."""
        top_k = expert_ids.shape[1]
        flat = expert_ids.reshape(-1)
        order = flat.argsort(stable=True)
        token_idx = order // top_k
        # scatter_add_ rather than bincount: bincount reads its maximum back to the host.
        counts = torch.zeros(self.num_experts, dtype=torch.int32, device=x.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        offsets = counts.cumsum(0, dtype=torch.int32)
        hidden = silu_mul(_grouped_mm(x[token_idx], self.gate_up_proj.transpose(1, 2), offs=offsets))
        y = _grouped_mm(hidden, self.down_proj.transpose(1, 2), offs=offsets)
        y = y * weights.reshape(-1)[order, None].to(y.dtype)
        return torch.zeros_like(x).index_add_(0, token_idx, y.to(x.dtype))

    def looped(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        # Group by expert: each hit expert runs once on all tokens routed to it.
        for expert in torch.unique(expert_ids).tolist():
            token_idx, slot = torch.where(expert_ids == expert)
            gate, up = F.linear(x[token_idx], self.gate_up_proj[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.down_proj[expert]) * weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out


class QuantizedExperts(nn.Module):
    """Routed experts whose weights stay quantized: gate_proj, up_proj and down_proj each a stack of E (built from
    the checkpoint's per-expert tensors). On CUDA in half precision the fused quantized GEMMs; elsewhere each hit
    expert runs once on its tokens, as Experts.looped."""

    def __init__(self, num_experts: int, gate_proj: QuantizedLinear, up_proj: QuantizedLinear,
                 down_proj: QuantizedLinear):
        super().__init__()
        self.num_experts = num_experts
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        # Set by take_shared(): the shared expert as slot E of the fused kernels, read from its own tensors.
        self.shared: tuple[QuantizedLinear, QuantizedLinear, QuantizedLinear] | None = None

    @property
    def has_shared_slot(self) -> bool:
        return self.shared is not None

    def fits_shared(self, shared: GatedMLP) -> bool:
        """Whether `shared` can be slot E: each projection quantized as the routed experts' are (same layout class,
        sizes, block or group, zero points) and no biases."""
        def same(own: nn.Module, routed: QuantizedLinear) -> bool:
            return (type(own) is type(routed) and own.bias is None and routed.bias is None
                    and (own.in_features, own.out_features) == (routed.in_features, routed.out_features)
                    and getattr(own, "block", None) == getattr(routed, "block", None)
                    and getattr(own, "group_size", None) == getattr(routed, "group_size", None)
                    and (getattr(own, "qzeros", None) is None) == (getattr(routed, "qzeros", None) is None))

        return all(same(own, routed) for own, routed in zip(
            (shared.gate_proj, shared.up_proj, shared.down_proj), (self.gate_proj, self.up_proj, self.down_proj),
            strict=True))

    def take_shared(self, shared: GatedMLP) -> None:
        """Run `shared` (fits_shared) as slot E on the fused path; its parameters stay where they are."""
        self.shared = (shared.gate_proj, shared.up_proj, shared.down_proj)

    @classmethod
    def build(cls, linears: Linears, num_experts: int, hidden_size: int, intermediate_size: int
              ) -> QuantizedExperts | None:
        """The experts as the census' quantization converts them, or None when it keeps them unquantized."""
        gate, up, down = (linears.quantized(f"experts.*.{name}", inputs, outputs, experts=num_experts)
                          for name, inputs, outputs in (("gate_proj", hidden_size, intermediate_size),
                                                        ("up_proj", hidden_size, intermediate_size),
                                                        ("down_proj", intermediate_size, hidden_size)))
        if gate is None and up is None and down is None:
            return None
        if gate is None or up is None or down is None:
            raise EngineConfigError(f"{linears.config.source}: layer {linears.layer_index} quantizes some of its "
                                    "experts' projections but not all; the engine converts all three or none")
        return cls(num_experts, gate, up, down)

    @property
    def has_kernels(self) -> bool:
        """Whether the fused quantized kernels can run these experts: Triton installed, no biases (they add none)."""
        projections = (self.gate_proj, self.up_proj, self.down_proj)
        return quant_fused_experts is not None and all(p.bias is None for p in projections)

    def runs_triton(self, x: torch.Tensor) -> bool:
        """Whether the experts run as the fused quantized kernels: CUDA, half precision, has_kernels."""
        return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and self.has_kernels

    def routes_in_kernels(self, x: torch.Tensor, top_k: int) -> bool:
        return self.runs_triton(x) and fits_routing_kernels(x.shape[0], self.num_experts, top_k)

    def kernel_experts(self) -> tuple[QuantExperts, QuantExperts, QuantExperts]:
        """gate, up and down as the fused kernels take them (views of the parameters)."""
        return _kernel_view(self.gate_proj), _kernel_view(self.up_proj), _kernel_view(self.down_proj)

    def triton_parts(self, x: torch.Tensor, top_k: int, norm_topk_prob: bool, logits: torch.Tensor | None = None,
                     router_weight: torch.Tensor | None = None, partials: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """Experts.triton_parts over the quantized experts: the weighted parts [tokens, slots, hidden], top_k routed
        then the shared expert's when it is slot E (logits [tokens, E + 1], or the merged router's weight)."""
        experts, shared = self.kernel_experts(), self.has_shared_slot
        own = tuple(_kernel_view(linear, leading=True) for linear in self.shared) if shared else None
        if router_weight is not None:
            return quant_routed_experts(x, top_k, norm_topk_prob, *experts, router_weight=router_weight,
                                        partials=partials, shared=own)
        if self.routes_in_kernels(x, top_k):
            return quant_routed_experts(x, top_k, norm_topk_prob, *experts,
                                        logits=logits[:, :self.num_experts + shared], shared=own)
        expert_ids, weights = route(logits[:, :self.num_experts], top_k, norm_topk_prob)
        if shared:
            expert_ids, weights = with_shared_slot(expert_ids, weights,
                                                   logits[:, self.num_experts:self.num_experts + 1], self.num_experts)
        return quant_fused_experts(x, expert_ids, weights, *experts, shared=own)

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for expert in torch.unique(expert_ids).tolist():
            token_idx, slot = torch.where(expert_ids == expert)
            tokens = x[token_idx]
            hidden = F.silu(self.gate_proj(tokens, expert)) * self.up_proj(tokens, expert)
            y = self.down_proj(hidden, expert) * weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out


def _kernel_view(linear: QuantizedLinear, leading: bool = False) -> QuantExperts:
    """A quantized linear's tensors as the fused kernels take them; `leading`: a 2-D one given an expert dim of 1."""
    def lead(tensor: torch.Tensor | None) -> torch.Tensor | None:
        return tensor[None] if leading and tensor is not None else tensor

    if isinstance(linear, FP8BlockLinear):
        return Fp8Experts(lead(linear.weight), lead(linear.weight_scale_inv), linear.block)
    return W4Experts(lead(linear.qweight), lead(linear.scales), lead(linear.qzeros), linear.group_size)


class SparseMoE(nn.Module):
    def __init__(
        self, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int,
        norm_topk_prob: bool, shared_intermediate_size: int = 0, linears: Linears | None = None,
    ):
        """`linears` (scoped to the layer's `mlp`) makes the linears and experts a quantized checkpoint converts."""
        super().__init__()
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        make = linears or (lambda _, in_features, out_features: nn.Linear(in_features, out_features, bias=False))
        self.gate = make("gate", hidden_size, num_experts)  # the router
        quantized = QuantizedExperts.build(linears, num_experts, hidden_size, intermediate_size) if linears else None
        self.experts = quantized if quantized is not None else Experts(num_experts, hidden_size, intermediate_size)
        self.shared_expert = GatedMLP(hidden_size, shared_intermediate_size, linears=linears and linears.scoped(
            "shared_expert")) if shared_intermediate_size else None
        self.shared_expert_gate = make("shared_expert_gate", hidden_size, 1) if shared_intermediate_size else None
        self.router_weight: torch.Tensor | None = None  # gate rows then the shared gate's row, once merged

    def merge_projections(self) -> None:
        """Router and shared-expert gate as one GEMV; a shared expert of one expert's shape stacked as expert E.
        Quantized ones stay apart (engine/layers/quantized.py)."""
        if self.shared_expert_gate is None:
            return
        if isinstance(self.gate, nn.Linear) and isinstance(self.shared_expert_gate, nn.Linear):
            self.router_weight = stack_rows([self.gate.weight, self.shared_expert_gate.weight], self.router_weight)
        if self._shared_fits_a_slot():
            self.experts.stack_shared(self.shared_expert)
        elif (isinstance(self.experts, QuantizedExperts) and self.router_weight is not None
              and self.experts.fits_shared(self.shared_expert)):
            self.experts.take_shared(self.shared_expert)

    def _shared_fits_a_slot(self) -> bool:
        """Whether the shared expert has a routed expert's shape (Qwen3-Next: both 512 wide), so it can be one:
        both unquantized, with the router merged."""
        if not isinstance(self.experts, Experts) or self.router_weight is None:
            return False
        shared = self.shared_expert
        plain = all(isinstance(p, nn.Linear) for p in (shared.gate_proj, shared.up_proj, shared.down_proj))
        return plain and shared.down_proj.weight.shape == self.experts.down_proj.shape[1:]

    def kernel_router(self, x: torch.Tensor) -> torch.Tensor | None:
        """The router's weight when the routing kernels compute the logits from x themselves (no cuBLAS GEMV): on
        the routing kernels' path, for a router small enough, when nothing else needs the logits. That is the merged
        router ([E + 1, H]) with the shared expert as slot E, or the router alone without a shared expert; a shared
        expert of its own (or an unmerged layer's) needs its gate's logit from the GEMV anyway. Else None."""
        if self.experts.has_shared_slot:
            weight = self.router_weight
        elif self.shared_expert is None and isinstance(self.gate, nn.Linear):
            weight = self.gate.weight
        else:
            return None
        fits = self.experts.routes_in_kernels(x, self.top_k) and weight.dtype == x.dtype
        return weight if fits and fits_router_gemv(self.experts.num_experts, x.shape[1]) else None

    def folds_norm(self, mixer_out: torch.Tensor, norm: RMSNorm) -> bool:
        """Whether forward_with_norm serves this batch: where the routing kernels compute the logits (kernel_router),
        with the norm's weight in the batch's dtype (as the norm kernel takes it)."""
        return norm.weight.dtype == mixer_out.dtype and self.kernel_router(mixer_out) is not None

    def forward_with_norm(self, mixer_out: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(norm(residual + mixer_out)) as parts, residual + mixer_out): the norm and its residual add inside
        the router's partials launch. Both results are new tensors, `residual` is not written (the first layer's is
        the caller's). Only where folds_norm says so."""
        router_weight = self.kernel_router(mixer_out)
        partials, normed, summed = normed_router_partials(mixer_out, residual, norm.weight, norm.eps, norm.one_centred,
                                                          router_weight, self.experts.has_shared_slot)
        parts = self.experts.triton_parts(normed, self.top_k, self.norm_topk_prob, router_weight=router_weight,
                                          partials=partials)
        return parts, summed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [tokens, hidden] -> [tokens, hidden], or on the Triton path the weighted parts [tokens, slots, hidden]
        (top_k routed, then the shared expert's when it runs as slot E), left for the consumer to sum."""
        router_weight = self.kernel_router(x)
        if router_weight is not None:  # the logits are computed inside the routing kernels
            return self.experts.triton_parts(x, self.top_k, self.norm_topk_prob, router_weight=router_weight)
        if self.router_weight is not None:
            logits = F.linear(x, self.router_weight)  # the experts' logits, then the shared gate's
            shared_logit = logits[..., -1:]
        else:
            logits = self.gate(x)
            shared_logit = self.shared_expert_gate(x) if self.shared_expert_gate is not None else None
        if self.experts.runs_triton(x):
            parts = self.experts.triton_parts(x, self.top_k, self.norm_topk_prob, logits=logits)
            if self.shared_expert is None or self.experts.has_shared_slot:
                return parts
            out = parts.sum(1)  # a shared expert of its own size (or unmerged) runs as its own MLP
        else:
            expert_ids, weights = route(logits[..., :self.experts.num_experts], self.top_k, self.norm_topk_prob)
            out = self.experts(x, expert_ids, weights)
        if self.shared_expert is not None:
            out = gate_shared(out, shared_logit, self.shared_expert(x))
        return out


@fused
def route(logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k expert ids and their weights per token; probabilities in float32 like the reference."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, expert_ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return expert_ids, weights.to(logits.dtype)


@fused
def with_shared_slot(expert_ids: torch.Tensor, weights: torch.Tensor, shared_logit: torch.Tensor, shared_id: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """route's ids and weights [tokens, top_k] plus slot top_k: expert `shared_id` (E, the shared expert stacked after
    the routed ones) with weight sigmoid(shared_logit [tokens, 1]) in float32, as gate_shared takes it."""
    return (torch.cat([expert_ids, torch.full_like(expert_ids[:, :1], shared_id)], 1),
            torch.cat([weights, torch.sigmoid(shared_logit.float()).to(weights.dtype)], 1))


@fused
def gate_shared(routed: torch.Tensor, gate: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    return routed + torch.sigmoid(gate) * shared
