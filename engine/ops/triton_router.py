"""The MoE router's GEMV for decode-sized batches, split over the hidden dimension.

One program a tile of 16 tokens (tl.dot's smallest M) and a chunk of BLOCK_H hidden features computes the tile's
partial logits over its chunk, x @ W^T in float32, into a [chunks, tokens, E (+1)] float32 scratch whose sum over
chunks is the logits: at batch 1 one program reading the whole router weight (135 KB for Qwen3-Next's 33 x 2048 rows)
took 18.7 us a layer on the H200, where the weight spread over 16 programs is read at once. The routing launch
(engine/ops/triton_route.py) sums the partials in chunk order. With `shared` the weight's last row is the shared
expert's gate: its column is a plain dot product, not part of the tensor-core tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_TILE_TOKENS = 16  # small tiles, many programs; also tl.dot's smallest M, so the GEMV tile is always 16
ROUTER_TILE = 4096  # a partials program's [16, E_PAD] float32 accumulator, kept in registers
ROUTER_BLOCK_H = 128  # hidden features a partials program reads: 16 programs a tile at hidden 2048 (tuned on the GPU)
ROUTER_BLOCK_ELEMENTS = 8192  # a partials program's weight block at most (E_PAD x BLOCK_H): wide routers, short chunks
ROUTER_WARPS = 4  # a partials program is one [16, BLOCK_H] x [BLOCK_H, E_PAD] dot (tuned on the GPU)
ROUTER_PARTIALS = 1024  # E_PAD x chunks float32 partials a token at most (written, then summed): small routers only


def experts_pad(num_experts: int) -> int:
    return max(16, triton.next_power_of_2(num_experts))  # a power of two, and tl.dot's smallest N


def router_block_h(num_experts: int, hidden: int) -> int:
    """The hidden features each program of the router's partials reads: tl.dot's smallest K (16) at least."""
    widest = ROUTER_BLOCK_ELEMENTS // experts_pad(num_experts)
    return max(16, min(ROUTER_BLOCK_H, triton.next_power_of_2(hidden), widest))


def router_chunks(num_experts: int, hidden: int) -> int:
    """The hidden chunks the router's GEMV is split into: its partials' programs a tile, the partials a logit sums."""
    return triton.cdiv(hidden, router_block_h(num_experts, hidden))


def fits_router_gemv(num_experts: int, hidden: int) -> bool:
    """Whether route_and_align can compute the logits from x and the router's weight: a 16-token tile's partial logits
    fit a program's registers, and a token's partials (written, then summed by the routing launch) stay few, so small
    routers only (Qwen3-Next's: 32 x 16 chunks at hidden 2048); a large router's logits come from one GEMM instead."""
    e_pad = experts_pad(num_experts)
    return MAX_TILE_TOKENS * e_pad <= ROUTER_TILE and e_pad * router_chunks(num_experts, hidden) <= ROUTER_PARTIALS


@triton.jit
def _router_partials_kernel(x_ptr, w_ptr, partials_ptr, tokens, stride_xt, stride_xh, stride_we, stride_wh,
                            NUM_EXPERTS: tl.constexpr, SHARED: tl.constexpr, HIDDEN: tl.constexpr,
                            E_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                            PRECISION: tl.constexpr):
    """A tile's partial logits over one hidden chunk: x [tokens, HIDDEN] @ the router's rows [E (+1), HIDDEN]^T over
    the chunk's features, float32, to partials [chunks, tokens, E (+1)]."""
    tile = tl.program_id(0)
    chunk = tl.program_id(1)
    t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < tokens
    e = tl.arange(0, E_PAD)
    e_ok = e < NUM_EXPERTS
    h = chunk * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = h < HIDDEN
    xs = tl.load(x_ptr + t.to(tl.int64)[:, None] * stride_xt + h[None, :] * stride_xh,
                 mask=t_ok[:, None] & h_ok[None, :], other=0.0)
    w = tl.load(w_ptr + e[None, :] * stride_we + h[:, None] * stride_wh, mask=e_ok[None, :] & h_ok[:, None],
                other=0.0)
    partial = tl.dot(xs, w, input_precision=PRECISION)
    out = partials_ptr + (chunk * tokens + t).to(tl.int64) * (NUM_EXPERTS + SHARED)
    tl.store(out[:, None] + e[None, :], partial, mask=t_ok[:, None] & e_ok[None, :])
    if SHARED:  # the merged router's last row, the shared gate: one column, no dot of its own
        w_shared = tl.load(w_ptr + NUM_EXPERTS * stride_we + h * stride_wh, mask=h_ok, other=0.0)
        tl.store(out + NUM_EXPERTS, tl.sum(xs.to(tl.float32) * w_shared.to(tl.float32)[None, :], 1), mask=t_ok)


def router_partials(x: torch.Tensor, router_weight: torch.Tensor, shared: bool) -> torch.Tensor:
    """x [tokens, hidden] @ router_weight [E (+1), hidden]^T split over hidden chunks: float32 partials
    [chunks, tokens, E (+1)] whose sum over chunks is the logits (launch 0). The caller checks fits_router_gemv."""
    tokens, hidden = x.shape
    num_experts = router_weight.shape[0] - shared
    block_h = router_block_h(num_experts, hidden)
    partials = torch.empty((triton.cdiv(hidden, block_h), tokens, router_weight.shape[0]), dtype=torch.float32,
                           device=x.device)
    _router_partials_kernel[(triton.cdiv(tokens, MAX_TILE_TOKENS), partials.shape[0])](
        x, router_weight, partials, tokens, x.stride(0), x.stride(1), router_weight.stride(0), router_weight.stride(1),
        NUM_EXPERTS=num_experts, SHARED=int(shared), HIDDEN=hidden, E_PAD=experts_pad(num_experts),
        BLOCK_T=MAX_TILE_TOKENS, BLOCK_H=block_h,
        PRECISION="ieee" if x.dtype == torch.float32 else None,  # fp32 (the interpreter): no tf32
        num_warps=ROUTER_WARPS,
    )
    return partials
