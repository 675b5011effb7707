"""The MoE router's GEMV for decode-sized batches, split over the hidden dimension.

One program a tile of 16 tokens (tl.dot's smallest M) and a chunk of BLOCK_H hidden features computes the tile's
partial logits over its chunk, x @ W^T in float32, into a [chunks, tokens, E (+1)] float32 scratch whose sum over
chunks is the logits: at batch 1 one program reading the whole router weight (135 KB for Qwen3-Next's 33 x 2048 rows)
took 18.7 us a layer on the H200, where the weight spread over 16 programs is read at once. The routing launch
(engine/ops/triton_route.py) sums the partials in chunk order. With `shared` the weight's last row is the shared
expert's gate: its column is a plain dot product, not part of the tensor-core tile.

At decode the MoE's pre-norm (post_attention_layernorm with its residual add) runs inside this launch too
(`normed_router_partials`): each program reads its tile's mixer output and residual rows whole (a row's sum of squares
needs them all), norms them as engine/ops/triton_norm.py does, multiplies its chunk of the normed rows into the partial
logits and writes that chunk of the new residual and of the normed rows (the experts' input) to new tensors. Out of
place because the other programs of the tile still read the old residual rows: in place would race. That saves the
norm's launch (and its graph gap) a layer.
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
def _added_rows(mixer_rows, residual_rows, cols, ok, stride_xh, stride_rh):
    """A tile's residual + mixer output over `cols`, rounded to the dtype as the eager add rounds, then float32."""
    mixer = tl.load(mixer_rows + cols[None, :] * stride_xh, mask=ok, other=0.0)
    residual = tl.load(residual_rows + cols[None, :] * stride_rh, mask=ok, other=0.0)
    return (residual.to(tl.float32) + mixer.to(tl.float32)).to(mixer.dtype).to(tl.float32)


@triton.jit
def _add_and_norm(x_ptr, residual_ptr, norm_weight_ptr, summed_ptr, normed_ptr, t, t_ok, h, h_ok, eps,
                  stride_xt, stride_xh, stride_rt, stride_rh, HIDDEN: tl.constexpr, BLOCK_T: tl.constexpr,
                  BLOCK_H: tl.constexpr, ONE_CENTRED: tl.constexpr):
    """The post-attention norm of a tile's rows over this program's chunk: summed = residual + mixer output and
    normed = norm(summed), rounded as triton_norm's _rms_norm_kernel rounds, each chunk written to its new tensor
    (out of place: the chunk's neighbours still read the old residual rows). Returns the normed chunk (the dtype).
    The sum of squares needs whole rows, so every program reads its tile's rows whole: at batch 1 a program reads 8 KB
    (hidden 2048, bf16); past one token it is 16x the tile's rows across the tile's chunk programs (2 MB of L2 reads
    a 16-token tile at hidden 2048), against one read of them by the norm kernel."""
    rows = t.to(tl.int64)[:, None]
    mixer_rows, residual_rows = x_ptr + rows * stride_xt, residual_ptr + rows * stride_rt
    # Squares accumulated elementwise over the chunks, reduced once: the sum's order differs from the norm kernel's
    # one reduction of the whole row (float32 rounding of the sum: the normed row within an ulp of the dtype).
    squares = tl.zeros([BLOCK_T, BLOCK_H], tl.float32)
    for h0 in tl.static_range(0, HIDDEN, BLOCK_H):  # unrolled: the row's loads issue together, not one by one
        cols = h0 + tl.arange(0, BLOCK_H)
        summed = _added_rows(mixer_rows, residual_rows, cols, t_ok[:, None] & (cols < HIDDEN)[None, :], stride_xh,
                             stride_rh)
        squares += summed * summed
    rstd = tl.rsqrt(tl.sum(squares, 1) / HIDDEN + eps)
    ok = t_ok[:, None] & h_ok[None, :]
    summed = _added_rows(mixer_rows, residual_rows, h, ok, stride_xh, stride_rh)  # this chunk again (cached)
    out = rows * HIDDEN + h[None, :]
    tl.store(summed_ptr + out, summed.to(summed_ptr.dtype.element_ty), mask=ok)
    normed = summed * rstd[:, None]
    weight = tl.load(norm_weight_ptr + h, mask=h_ok, other=0.0).to(tl.float32)[None, :]
    # Qwen3-Next scales in float32; Llama rounds the normed row to the dtype before the weight.
    y = normed * (1.0 + weight) if ONE_CENTRED else weight * normed.to(normed_ptr.dtype.element_ty).to(tl.float32)
    y = y.to(normed_ptr.dtype.element_ty)
    tl.store(normed_ptr + out, y, mask=ok)
    return y


@triton.jit
def _router_partials_kernel(x_ptr, residual_ptr, norm_weight_ptr, summed_ptr, normed_ptr, w_ptr, partials_ptr,
                            tokens, eps, stride_xt, stride_xh, stride_rt, stride_rh, stride_we, stride_wh,
                            NUM_EXPERTS: tl.constexpr, SHARED: tl.constexpr, HIDDEN: tl.constexpr,
                            E_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                            PRECISION: tl.constexpr, NORM: tl.constexpr, ONE_CENTRED: tl.constexpr):
    """A tile's partial logits over one hidden chunk: x [tokens, HIDDEN] @ the router's rows [E (+1), HIDDEN]^T over
    the chunk's features, float32, to partials [chunks, tokens, E (+1)]. With NORM, x is the mixer output and the
    rows multiplied are norm(residual + x) (see _add_and_norm; the residual and norm arguments are unused without)."""
    tile = tl.program_id(0)
    chunk = tl.program_id(1)
    t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < tokens
    e = tl.arange(0, E_PAD)
    e_ok = e < NUM_EXPERTS
    h = chunk * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = h < HIDDEN
    if NORM:
        xs = _add_and_norm(x_ptr, residual_ptr, norm_weight_ptr, summed_ptr, normed_ptr, t, t_ok, h, h_ok, eps,
                           stride_xt, stride_xh, stride_rt, stride_rh, HIDDEN, BLOCK_T, BLOCK_H, ONE_CENTRED)
    else:
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
    return _launch_partials(x, router_weight, shared, x, x, 0.0, False)[0]


def normed_router_partials(mixer_out: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                           one_centred: bool, router_weight: torch.Tensor, shared: bool
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pre-norm and the router's partials in one launch: summed = residual + mixer_out and normed = RMSNorm(summed)
    (engine/layers/norm.py's roundings: one-centred (1 + w) or Llama's w), then router_partials(normed, ...).
    Returns (partials, normed, summed); `residual` is not written. All of [tokens, hidden] in one dtype, the norm's
    weight [hidden] and the router's too. The caller checks fits_router_gemv."""
    if not (mixer_out.shape == residual.shape and mixer_out.dtype == residual.dtype == norm_weight.dtype
            and norm_weight.shape == mixer_out.shape[1:]):
        raise ValueError(f"mixer output {tuple(mixer_out.shape)} {mixer_out.dtype}, residual {tuple(residual.shape)} "
                         f"{residual.dtype} and norm weight {tuple(norm_weight.shape)} {norm_weight.dtype} differ")
    return _launch_partials(mixer_out, router_weight, shared, residual, norm_weight.contiguous(), eps, True,
                            one_centred)


def _launch_partials(x: torch.Tensor, router_weight: torch.Tensor, shared: bool, residual: torch.Tensor,
                     norm_weight: torch.Tensor, eps: float, norm: bool, one_centred: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(partials, normed, summed); without `norm` the last two are x itself (residual and norm_weight unread)."""
    tokens, hidden = x.shape
    num_experts = router_weight.shape[0] - shared
    block_h = router_block_h(num_experts, hidden)
    partials = torch.empty((triton.cdiv(hidden, block_h), tokens, router_weight.shape[0]), dtype=torch.float32,
                           device=x.device)
    normed, summed = (torch.empty_like(x, memory_format=torch.contiguous_format) if norm else x for _ in range(2))
    _router_partials_kernel[(triton.cdiv(tokens, MAX_TILE_TOKENS), partials.shape[0])](
        x, residual, norm_weight, summed, normed, router_weight, partials, tokens, eps, x.stride(0), x.stride(1),
        residual.stride(0), residual.stride(1), router_weight.stride(0), router_weight.stride(1),
        NUM_EXPERTS=num_experts, SHARED=int(shared), HIDDEN=hidden, E_PAD=experts_pad(num_experts),
        BLOCK_T=MAX_TILE_TOKENS, BLOCK_H=block_h,
        PRECISION="ieee" if x.dtype == torch.float32 else None,  # fp32 (the interpreter): no tf32
        NORM=norm, ONE_CENTRED=one_centred, num_warps=ROUTER_WARPS,
    )
    return partials, normed, summed
