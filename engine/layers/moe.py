"""Sparse MoE FFN: softmax router, top-k (optionally renormalised), routed experts and a sigmoid-gated shared expert.

Expert weights are held fused as 3-D tensors (gate and up stacked), the layout transformers keeps in memory;
the loader builds them from either checkpoint layout (per-expert tensors or fused).
On CUDA in half precision the routed experts run as two fused Triton grouped GEMMs (engine/ops/triton_moe.py: SiLU·mul
and the routing weights inside them; at decode sizes the routing and the sort by expert are one more launch,
engine/ops/triton_route.py); without Triton, bf16 runs two torch grouped matmuls over the pairs sorted by
expert. Both make no host synchronisation (a decode step can be captured in a CUDA graph) and read only the experts
hit. Elsewhere each hit expert runs once on its tokens (the reference path).
`SparseMoE.merge_projections()` stacks the router and the shared-expert gate into one [E + 1, H] tensor: one GEMV
serves both (the shared expert's own gate and up merge in GatedMLP).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.fused import fused
from engine.layers.merge import stack_rows
from engine.layers.mlp import GatedMLP, silu_mul

try:
    from engine.ops.triton_moe import fused_experts, routed_experts
    from engine.ops.triton_route import fits_one_launch
except ImportError:  # no Triton (CPU-only installs): grouped_mm on CUDA bf16, the loop elsewhere
    fused_experts = routed_experts = fits_one_launch = None

_grouped_mm = getattr(F, "grouped_mm", None) or torch._grouped_mm


class Experts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts = num_experts
        # gate rows first, then up rows, as transformers stacks them.
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [tokens, hidden]; expert_ids, weights [tokens, top_k]."""
        if self.runs_triton(x):
            return self.fused(x, expert_ids, weights)
        if x.is_cuda and x.dtype == torch.bfloat16:
            return self.grouped(x, expert_ids, weights)
        return self.looped(x, expert_ids, weights)

    def runs_triton(self, x: torch.Tensor) -> bool:
        """Whether the routed experts run as the Triton kernels: CUDA, half precision, Triton installed."""
        half = x.dtype in (torch.bfloat16, torch.float16) and self.gate_up_proj.dtype == x.dtype
        return x.is_cuda and half and fused_experts is not None

    def routes_in_one_launch(self, x: torch.Tensor, top_k: int) -> bool:
        """Whether routing and alignment run as one Triton launch (decode-sized batches on the Triton path)."""
        return self.runs_triton(x) and fits_one_launch(x.shape[0], self.num_experts, top_k)

    def fused_from_logits(self, x: torch.Tensor, router_logits: torch.Tensor, top_k: int,
                          norm_topk_prob: bool) -> torch.Tensor:
        """The Triton path from the router's logits: one launch routes and aligns, then the two GEMM kernels."""
        return routed_experts(x, router_logits, top_k, norm_topk_prob, self.gate_up_proj, self.down_proj)

    def fused(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The Triton path: gate_up GEMM with SiLU·mul, then down GEMM with the routing weights, per expert block."""
        return fused_experts(x, expert_ids, weights, self.gate_up_proj, self.down_proj)

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


class SparseMoE(nn.Module):
    def __init__(
        self, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int,
        norm_topk_prob: bool, shared_intermediate_size: int = 0,
    ):
        super().__init__()
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)  # the router
        self.experts = Experts(num_experts, hidden_size, intermediate_size)
        self.shared_expert = GatedMLP(hidden_size, shared_intermediate_size) if shared_intermediate_size else None
        self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False) if shared_intermediate_size else None
        self.router_weight: torch.Tensor | None = None  # gate rows then the shared gate's row, once merged

    def merge_projections(self) -> None:
        """Router and shared-expert gate as one GEMV (the shared expert merges itself: it is a module of its own)."""
        if self.shared_expert_gate is not None:
            self.router_weight = stack_rows([self.gate.weight, self.shared_expert_gate.weight])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.router_weight is not None:
            logits = F.linear(x, self.router_weight)
            router_logits, shared_logit = logits[..., :-1], logits[..., -1:]
        else:
            router_logits = self.gate(x)
            shared_logit = self.shared_expert_gate(x) if self.shared_expert_gate is not None else None
        if self.experts.routes_in_one_launch(x, self.top_k):
            out = self.experts.fused_from_logits(x, router_logits, self.top_k, self.norm_topk_prob)
        else:
            expert_ids, weights = route(router_logits, self.top_k, self.norm_topk_prob)
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
def gate_shared(routed: torch.Tensor, gate: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    return routed + torch.sigmoid(gate) * shared
