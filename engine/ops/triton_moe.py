"""Fused MoE experts as two Triton grouped GEMMs over the (token, slot) pairs sorted by expert.

`align` sorts the pairs by expert and pads each expert's run to a multiple of BLOCK_M with a sentinel pair id, so every
M-block of the sorted list belongs to one expert (`block_expert`; -1 marks the unused blocks at the end). Its sizes
depend only on the number of pairs, so a captured CUDA graph serves any routing. Then:
  kernel 1: h = silu(x[token] @ gate[e]^T) * (x[token] @ up[e]^T) per M-block, gathering x rows itself (no copy of x
            per pair, no separate silu_mul);
  kernel 2: y[pair] = weight[pair] * (h @ down[e]^T), scattered back to the pair's own row.
The result is the weighted parts y.view(tokens, slots, hidden), not their sum: the consumer (the next RMSNorm, or the
range end) sums them in float32 while it reads them, so the sum costs no launch of its own.
A model's shared expert can ride along as expert E (stacked after the routed experts in the weight tensors, see
engine/layers/moe.py): one more slot a token, weighted by the sigmoid of its gate, and no kernels of its own.
For decode-sized batches `routed_experts` starts from the router's logits, or from x and the router's weight (its
GEMV then split over hidden chunks, one launch more): routing and align in Triton (engine/ops/triton_route.py: one
launch for a batch of one tile, else two) instead of route's and align's ~9 small kernels, so a layer is the routing
launches and the two GEMMs. Only the experts hit are read, each once per M-block. Accumulation in float32, one cast
at each store.
Runs under TRITON_INTERPRET=1 on CPU tensors too (that is how CI checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.ops.fused import fused
from engine.ops.triton_route import route_and_align


@dataclass(frozen=True)
class TileConfig:
    block_m: int  # pairs per M-block (the padding unit of align)
    gate_n: int  # kernel 1: intermediate columns per program (gate and up tiles each)
    gate_k: int  # kernel 1: hidden per inner step
    down_n: int  # kernel 2: hidden columns per program
    down_k: int  # kernel 2: intermediate per inner step
    num_warps: int
    gate_stages: int  # kernel 1's software pipelining depth
    down_stages: int  # kernel 2's


# Small M-blocks at decode (many programs stream the weights: bandwidth-bound); wide tiles once each expert has enough
# pairs for the tensor cores to matter. Every tl.dot dim >= 16, all powers of two. The 16-row tile is measured
# (benchmarks/decode_tiles.py, H200, 2026-12-04, weights read from HBM as in a step): at batch 1 gate_up 12.8 us
# (3.0 TB/s) and down 7.3 us with 4 stages (7.8 with 3); at batch 8 32.1 and 17.4 us.
CONFIGS = {
    16: TileConfig(16, gate_n=64, gate_k=256, down_n=64, down_k=64, num_warps=4, gate_stages=3, down_stages=4),
    32: TileConfig(32, gate_n=64, gate_k=64, down_n=64, down_k=64, num_warps=4, gate_stages=4, down_stages=4),
    64: TileConfig(64, gate_n=64, gate_k=64, down_n=128, down_k=64, num_warps=8, gate_stages=3, down_stages=3),
}


def pick_block_m(num_pairs: int, num_experts: int) -> int:
    """The M-block that wastes little padding for the average pairs per expert."""
    per_expert = num_pairs / num_experts
    return 16 if per_expert <= 16 else 32 if per_expert <= 48 else 64


def num_blocks_for(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Enough M-blocks for any routing: each hit expert (at most min(E, pairs)) pads by < block_m."""
    return triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m)


@fused
def align(expert_ids: torch.Tensor, num_experts: int, block_m: int,
          num_blocks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """expert_ids [tokens, slots] -> sorted_pair_ids [num_blocks * block_m] int32 (pair = token * slots + slot;
    padding holds the sentinel tokens * slots), block_expert [num_blocks] int32 (-1: unused), used [1] (entries in
    use). Tensor ops only, fixed output sizes: no host synchronisation."""
    flat = expert_ids.reshape(-1).long()
    num_pairs = flat.numel()
    sorted_experts, order = torch.sort(flat, stable=True)
    experts = torch.arange(num_experts + 1, device=flat.device)
    starts = torch.searchsorted(sorted_experts, experts)  # each expert's first sorted position; the last is num_pairs
    counts = starts.diff()
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = padded.cumsum(0)
    # A pair keeps its rank within its expert's run; the run moves from its sorted start to its padded start.
    shift = padded_ends - padded - starts[:-1]
    dest = torch.arange(num_pairs, device=flat.device) + shift[sorted_experts]
    sorted_pair_ids = torch.full((num_blocks * block_m,), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_pair_ids.scatter_(0, dest, order.int())
    # Every used block starts with a real pair, so writing each pair's expert to its block covers them all.
    block_expert = torch.full((num_blocks,), -1, dtype=torch.int32, device=flat.device)
    block_expert.scatter_(0, dest // block_m, sorted_experts.int())
    return sorted_pair_ids, block_expert, padded_ends[-1:]


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, h_ptr, pair_ids_ptr, block_expert_ptr, num_pairs,
                    stride_xt, stride_xh, stride_we, stride_wn, stride_wk, stride_hm,
                    HIDDEN: tl.constexpr, INTER: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    block, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:  # past the last used block
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(pair_ids_ptr + rows)
    real = pairs < num_pairs
    tokens = (pairs // SLOTS).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < INTER
    w = w_ptr + expert.to(tl.int64) * stride_we
    gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < HIDDEN
        a = tl.load(x_ptr + tokens[:, None] * stride_xt + k[None, :] * stride_xh, mask=real[:, None] & k_ok[None, :],
                    other=0.0)
        w_mask = k_ok[:, None] & n_ok[None, :]
        # [BLOCK_K, BLOCK_N] tiles of the expert's gate rows and up rows (the up rows follow the INTER gate rows).
        w_gate = tl.load(w + n[None, :] * stride_wn + k[:, None] * stride_wk, mask=w_mask, other=0.0)
        w_up = tl.load(w + (n[None, :] + INTER) * stride_wn + k[:, None] * stride_wk, mask=w_mask, other=0.0)
        gate = tl.dot(a, w_gate, gate, input_precision=PRECISION)
        up = tl.dot(a, w_up, up, input_precision=PRECISION)
    h = gate * tl.sigmoid(gate) * up  # silu(gate) * up; padding rows get 0 (their x was masked to 0)
    tl.store(h_ptr + rows[:, None].to(tl.int64) * stride_hm + n[None, :], h.to(h_ptr.dtype.element_ty),
             mask=n_ok[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, y_ptr, pair_ids_ptr, block_expert_ptr, weights_ptr, num_pairs,
                 stride_hm, stride_we, stride_wn, stride_wk, stride_ym, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    block, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(pair_ids_ptr + rows)
    real = pairs < num_pairs
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < HIDDEN
    w = w_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < INTER
        a = tl.load(h_ptr + rows[:, None].to(tl.int64) * stride_hm + k[None, :], mask=k_ok[None, :], other=0.0)
        b = tl.load(w + n[None, :] * stride_wn + k[:, None] * stride_wk, mask=k_ok[:, None] & n_ok[None, :],
                    other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    weight = tl.load(weights_ptr + pairs, mask=real, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    tl.store(y_ptr + pairs[:, None].to(tl.int64) * stride_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=real[:, None] & n_ok[None, :])


def _precision(dtype: torch.dtype) -> str | None:
    return "ieee" if dtype == torch.float32 else None  # fp32 (the interpreter tests) must not round through tf32


def gate_up_silu(x: torch.Tensor, gate_up_proj: torch.Tensor, sorted_pair_ids: torch.Tensor,
                 block_expert: torch.Tensor, slots: int, config: TileConfig, out: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """x [tokens, hidden], gate_up_proj [E, 2I, hidden] -> h [sorted rows, I] (rows of unused blocks unwritten)."""
    num_experts, two_inter, hidden = gate_up_proj.shape
    inter = two_inter // 2
    if out is None:
        out = x.new_empty((sorted_pair_ids.numel(), inter))
    grid = (block_expert.numel(), triton.cdiv(inter, config.gate_n))
    _gate_up_kernel[grid](
        x, gate_up_proj, out, sorted_pair_ids, block_expert, x.shape[0] * slots,
        x.stride(0), x.stride(1), gate_up_proj.stride(0), gate_up_proj.stride(1), gate_up_proj.stride(2),
        out.stride(0), HIDDEN=hidden, INTER=inter, SLOTS=slots, BLOCK_M=config.block_m, BLOCK_N=config.gate_n,
        BLOCK_K=config.gate_k, PRECISION=_precision(x.dtype), num_warps=config.num_warps, num_stages=config.gate_stages,
    )
    return out


def down_weighted(h: torch.Tensor, down_proj: torch.Tensor, sorted_pair_ids: torch.Tensor, block_expert: torch.Tensor,
                  pair_weights: torch.Tensor, config: TileConfig, out: torch.Tensor | None = None) -> torch.Tensor:
    """h [sorted rows, I], down_proj [E, hidden, I], pair_weights [pairs] -> y [pairs, hidden], each pair's row
    weighted by its routing weight."""
    num_experts, hidden, inter = down_proj.shape
    num_pairs = pair_weights.numel()
    if out is None:
        out = h.new_empty((num_pairs, hidden))
    h = h.contiguous()  # the loads assume a unit-stride inner dim (free: kernel 1 writes it so)
    grid = (block_expert.numel(), triton.cdiv(hidden, config.down_n))
    _down_kernel[grid](
        h, down_proj, out, sorted_pair_ids, block_expert, pair_weights, num_pairs,
        h.stride(0), down_proj.stride(0), down_proj.stride(1), down_proj.stride(2), out.stride(0),
        HIDDEN=hidden, INTER=inter, BLOCK_M=config.block_m, BLOCK_N=config.down_n, BLOCK_K=config.down_k,
        PRECISION=_precision(h.dtype), num_warps=config.num_warps, num_stages=config.down_stages,
    )
    return out


def fused_experts(x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, gate_up_proj: torch.Tensor,
                  down_proj: torch.Tensor, block_m: int | None = None) -> torch.Tensor:
    """x [tokens, hidden]; expert_ids, weights [tokens, slots]; gate_up_proj [E, 2I, hidden] (gate rows first);
    down_proj [E, hidden, I] -> the weighted parts [tokens, slots, hidden] in x's dtype (their sum over slots is the
    MoE's output). `block_m` overrides the tile choice (tests)."""
    tokens, slots = expert_ids.shape
    num_experts = gate_up_proj.shape[0]
    num_pairs = tokens * slots
    if num_pairs == 0:
        return x.new_zeros((tokens, slots, x.shape[1]))
    config = CONFIGS[block_m or pick_block_m(num_pairs, num_experts)]
    num_blocks = num_blocks_for(num_pairs, num_experts, config.block_m)
    sorted_pair_ids, block_expert, _ = align(expert_ids, num_experts, config.block_m, num_blocks)
    return _aligned_experts(x, sorted_pair_ids, block_expert, weights, gate_up_proj, down_proj, config)


def routed_experts(x: torch.Tensor, top_k: int, norm_topk_prob: bool, gate_up_proj: torch.Tensor,
                   down_proj: torch.Tensor, *, logits: torch.Tensor | None = None,
                   router_weight: torch.Tensor | None = None, partials: torch.Tensor | None = None,
                   shared: bool = False, block_m: int | None = None) -> torch.Tensor:
    """fused_experts from the router's `logits` [tokens, E], or from x and `router_weight` [E, hidden] (the logits
    computed by the routing kernels, no cuBLAS GEMV): routing and alignment in Triton (triton_route; the
    caller checks fits_routing_kernels, and fits_router_gemv given the weight), then the two kernels. With `shared`
    the logits are [tokens, E + 1] (the weight [E + 1, hidden]; the shared gate's last) and the weights hold the
    shared expert as expert E: the parts are [tokens, top_k + 1, hidden], the last the shared expert's. `partials`
    (with the weight): the router's partials of x made already (the MoE's norm folded into their launch)."""
    assert (logits is None) != (router_weight is None), "the logits or the router's weight, not both"
    tokens, num_experts = x.shape[0], gate_up_proj.shape[0]
    num_pairs = tokens * (top_k + shared)
    config = CONFIGS[block_m or pick_block_m(num_pairs, num_experts)]
    num_blocks = num_blocks_for(num_pairs, num_experts, config.block_m)
    _, weights, sorted_pair_ids, block_expert, _ = route_and_align(
        x if logits is None else logits, top_k, norm_topk_prob, config.block_m, num_blocks, shared, router_weight,
        partials)
    return _aligned_experts(x, sorted_pair_ids, block_expert, weights, gate_up_proj, down_proj, config)


def _aligned_experts(x: torch.Tensor, sorted_pair_ids: torch.Tensor, block_expert: torch.Tensor,
                     weights: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                     config: TileConfig) -> torch.Tensor:
    tokens, slots = weights.shape
    h = gate_up_silu(x, gate_up_proj, sorted_pair_ids, block_expert, slots, config)
    y = down_weighted(h, down_proj, sorted_pair_ids, block_expert, weights.reshape(-1).contiguous(), config)
    return y.view(tokens, slots, x.shape[1])
