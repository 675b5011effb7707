"""Fused MoE experts over quantized weights: engine/ops/triton_moe.py's two grouped GEMMs, each weight tile
dequantized in the kernel (block-scaled FP8 by triton_fp8.fp8_weight_rows, W4A16 by triton_w4a16.w4_weight_rows).

Same flow as triton_moe: `align` (or the routing kernels) sorts the (token, slot) pairs by expert into padded
M-blocks, kernel 1 writes h = silu(x @ gate^T) * (x @ up^T) per M-block, kernel 2 y[pair] = weight[pair] * (h @
down^T). Sizes depend only on the number of pairs, so a decode step through them captures in a CUDA graph. The weights
are the dense formats with a leading expert dim, gate and up apart (as the checkpoints store them and the engine
holds them, engine/layers/quantized.py):
  Fp8Experts  weight float8_e4m3fn [E, N, K], scale_inv float32 [E, ceil(N/bn), ceil(K/bk)], block (bn, bk)
  W4Experts   qweight int32 [E, N, K/8], scales [E, N, K/G] in x's dtype, zeros None or int32 [E, K/G, ceil(N/8)]
A shared expert of the routed experts' shape and format rides along as expert E (`shared`: its gate, up and down with
a leading dim of 1): one more slot a token, as triton_moe stacks it, but read from its own tensors (the kernels pick
its pointers for the blocks of expert E), so no weight is copied.
Every tile is dequantized in float32 and multiplied in x's dtype with float32 accumulation (W8A16 / W4A16); there is
no W8A8 expert path yet. The tiles are their own (QUANT_CONFIGS): a dequantized tile sits in shared memory beside
the raw one, so triton_moe's 16-row tile (gate_k 256, 3 stages) asks 344 KB of an H100's 227 KB.
Runs under TRITON_INTERPRET=1 on CPU tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.ops.triton_fp8 import fp8_weight_rows, precision
from engine.ops.triton_moe import TileConfig, align, num_blocks_for, pick_block_m
from engine.ops.triton_route import route_and_align
from engine.ops.triton_w4a16 import w4_weight_rows


@dataclass(frozen=True)
class Fp8Experts:
    weight: torch.Tensor  # float8_e4m3fn [E, N, K]
    scale_inv: torch.Tensor  # float32 [E, ceil(N / bn), ceil(K / bk)]
    block: tuple[int, int]  # (bn, bk)


@dataclass(frozen=True)
class W4Experts:
    qweight: torch.Tensor  # int32 [E, N, K / 8]
    scales: torch.Tensor  # [E, N, K / G] in x's dtype
    zeros: torch.Tensor | None  # int32 [E, K / G, ceil(N / 8)], or None: symmetric (8)
    group_size: int


QuantExperts = Fp8Experts | W4Experts


# Per stage: x's [BLOCK_M, BLOCK_K] tile and the raw weight tiles (fp8 bytes, or int32 words at half a byte a weight);
# once: the dequantized [BLOCK_N, BLOCK_K] tiles in x's dtype (two in kernel 1). Under 100 KB each, so any Hopper or
# Ampere part takes them.
QUANT_CONFIGS = {
    16: TileConfig(16, gate_n=64, gate_k=128, down_n=64, down_k=128, num_warps=4, gate_stages=3, down_stages=3),
    32: TileConfig(32, gate_n=64, gate_k=64, down_n=64, down_k=64, num_warps=4, gate_stages=3, down_stages=3),
    64: TileConfig(64, gate_n=64, gate_k=64, down_n=128, down_k=64, num_warps=8, gate_stages=3, down_stages=3),
}


def _shape(experts: QuantExperts) -> tuple[int, int, int]:
    """(E, N, K) of the dequantized weights, checking the parts agree."""
    if isinstance(experts, Fp8Experts):
        num_experts, n_features, k_features = experts.weight.shape
        bn, bk = experts.block
        expected = (num_experts, triton.cdiv(n_features, bn), triton.cdiv(k_features, bk))
        if experts.weight.dtype != torch.float8_e4m3fn or experts.scale_inv.dtype != torch.float32 \
                or tuple(experts.scale_inv.shape) != expected:
            raise ValueError(f"FP8 experts {experts.weight.dtype} {tuple(experts.weight.shape)} with scale_inv "
                             f"{experts.scale_inv.dtype} {tuple(experts.scale_inv.shape)}: need float8_e4m3fn "
                             f"[E, N, K] and float32 {expected} for block {tuple(experts.block)}")
        return num_experts, n_features, k_features
    num_experts, n_features, words = experts.qweight.shape
    k_features, group = words * 8, experts.group_size
    if group < 8 or group % 8 or k_features % group:
        raise ValueError(f"group_size {group} with K = {k_features}: the group size must be a multiple of 8 that "
                         "divides K")
    zeros_ok = experts.zeros is None or (experts.zeros.dtype == torch.int32 and tuple(experts.zeros.shape) == (
        num_experts, k_features // group, triton.cdiv(n_features, 8)))
    if experts.qweight.dtype != torch.int32 or tuple(experts.scales.shape) != (
            num_experts, n_features, k_features // group) or not zeros_ok:
        raise ValueError(f"W4 experts qweight {experts.qweight.dtype} {tuple(experts.qweight.shape)}, scales "
                         f"{tuple(experts.scales.shape)}, zeros "
                         f"{None if experts.zeros is None else tuple(experts.zeros.shape)}: need int32 [E, N, K/8], "
                         "[E, N, K/G] and None or int32 [E, K/G, ceil(N/8)]")
    return num_experts, n_features, k_features


def _pointers(experts: QuantExperts) -> list[torch.Tensor]:
    """The weight, scale and zero-point tensors a kernel reads (the weight again where there are no zeros)."""
    if isinstance(experts, Fp8Experts):
        return [experts.weight, experts.scale_inv, experts.weight]
    return [experts.qweight, experts.scales, experts.qweight if experts.zeros is None else experts.zeros]


def _strides(experts: QuantExperts) -> list[int]:
    """(expert, n, k) strides of the weight and of the scales, then (expert, group, n) of the zero points."""
    weight, scales, zeros = _pointers(experts)
    has_zeros = isinstance(experts, W4Experts) and experts.zeros is not None
    return [*weight.stride(), *scales.stride(), *(zeros.stride() if has_zeros else (0, 0, 0))]


def _formats(experts: QuantExperts) -> dict:
    if isinstance(experts, Fp8Experts):
        return dict(FP8=True, SCALE_N=experts.block[0], SCALE_K=experts.block[1], HAS_ZEROS=False)
    return dict(FP8=False, SCALE_N=1, SCALE_K=experts.group_size, HAS_ZEROS=experts.zeros is not None)


@triton.jit
def _expert_rows(w_ptr, s_ptr, z_ptr, n, n_ok, k0, K, stride_wn, stride_wk, stride_sn, stride_sk, stride_zg,
                 stride_zn, FP8: tl.constexpr, SCALE_N: tl.constexpr, SCALE_K: tl.constexpr,
                 HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One expert's dequantized [BLOCK_N, BLOCK_K] tile (rows n, columns k0 ..) in float32."""
    if FP8:
        w = fp8_weight_rows(w_ptr, s_ptr, n, n_ok, k0, K, stride_wn, stride_wk, stride_sn, stride_sk, SCALE_N,
                            SCALE_K, BLOCK_N, BLOCK_K)
    else:
        w = w4_weight_rows(w_ptr, s_ptr, z_ptr, n, n_ok, k0, K, stride_wn, stride_wk, stride_sn, stride_sk,
                           stride_zg, stride_zn, SCALE_K, HAS_ZEROS, BLOCK_N, BLOCK_K)
    return w


@triton.jit
def _gate_up_kernel(x_ptr, gw_ptr, gs_ptr, gz_ptr, uw_ptr, us_ptr, uz_ptr, sgw_ptr, sgs_ptr, sgz_ptr, suw_ptr,
                    sus_ptr, suz_ptr, h_ptr, pair_ids_ptr, block_expert_ptr, num_pairs, num_routed, stride_xt,
                    stride_xh, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk, stride_ze,
                    stride_zg, stride_zn, stride_hm, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                    SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    FP8: tl.constexpr, SCALE_N: tl.constexpr, SCALE_K: tl.constexpr, HAS_ZEROS: tl.constexpr,
                    PRECISION: tl.constexpr):
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
    e = expert.to(tl.int64)
    if expert == num_routed:  # the shared expert's own tensors
        gw, gs, gz, uw, us, uz = sgw_ptr, sgs_ptr, sgz_ptr, suw_ptr, sus_ptr, suz_ptr
    else:
        gw, gs, gz = gw_ptr + e * stride_we, gs_ptr + e * stride_se, gz_ptr + e * stride_ze
        uw, us, uz = uw_ptr + e * stride_we, us_ptr + e * stride_se, uz_ptr + e * stride_ze
    gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + tokens[:, None] * stride_xt + k[None, :] * stride_xh,
                    mask=real[:, None] & (k < HIDDEN)[None, :], other=0.0)
        w_gate = _expert_rows(gw, gs, gz, n, n_ok, k0, HIDDEN, stride_wn, stride_wk, stride_sn, stride_sk, stride_zg,
                              stride_zn, FP8, SCALE_N, SCALE_K, HAS_ZEROS, BLOCK_N, BLOCK_K)
        w_up = _expert_rows(uw, us, uz, n, n_ok, k0, HIDDEN, stride_wn, stride_wk, stride_sn, stride_sk, stride_zg,
                            stride_zn, FP8, SCALE_N, SCALE_K, HAS_ZEROS, BLOCK_N, BLOCK_K)
        gate = tl.dot(a, tl.trans(w_gate.to(a.dtype)), gate, input_precision=PRECISION)
        up = tl.dot(a, tl.trans(w_up.to(a.dtype)), up, input_precision=PRECISION)
    h = gate * tl.sigmoid(gate) * up  # silu(gate) * up; padding rows get 0 (their x was masked to 0)
    tl.store(h_ptr + rows[:, None].to(tl.int64) * stride_hm + n[None, :], h.to(h_ptr.dtype.element_ty),
             mask=n_ok[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, s_ptr, z_ptr, sw_ptr, ss_ptr, sz_ptr, y_ptr, pair_ids_ptr, block_expert_ptr, weights_ptr,
                 num_pairs, num_routed, stride_hm,
                 stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk, stride_ze, stride_zg, stride_zn,
                 stride_ym, HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, FP8: tl.constexpr, SCALE_N: tl.constexpr, SCALE_K: tl.constexpr,
                 HAS_ZEROS: tl.constexpr, PRECISION: tl.constexpr):
    block, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(pair_ids_ptr + rows)
    real = pairs < num_pairs
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < HIDDEN
    e = expert.to(tl.int64)
    if expert == num_routed:
        w, s, z = sw_ptr, ss_ptr, sz_ptr
    else:
        w, s, z = w_ptr + e * stride_we, s_ptr + e * stride_se, z_ptr + e * stride_ze
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(h_ptr + rows[:, None].to(tl.int64) * stride_hm + k[None, :], mask=(k < INTER)[None, :],
                    other=0.0)
        b = _expert_rows(w, s, z, n, n_ok, k0, INTER, stride_wn, stride_wk, stride_sn, stride_sk, stride_zg,
                         stride_zn, FP8, SCALE_N, SCALE_K, HAS_ZEROS, BLOCK_N, BLOCK_K)
        acc = tl.dot(a, tl.trans(b.to(a.dtype)), acc, input_precision=PRECISION)
    weight = tl.load(weights_ptr + pairs, mask=real, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    tl.store(y_ptr + pairs[:, None].to(tl.int64) * stride_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=real[:, None] & n_ok[None, :])


Shared = tuple[QuantExperts, QuantExperts, QuantExperts]


def _check(x: torch.Tensor, gate: QuantExperts, up: QuantExperts, down: QuantExperts,
           shared: Shared | None = None) -> tuple[int, int, int]:
    """(experts the kernels index, the shared one included; hidden; I), refusing experts whose formats, shapes or
    layouts do not agree."""
    gate_shape, up_shape, down_shape = _shape(gate), _shape(up), _shape(down)
    num_experts, inter, hidden = gate_shape
    if up_shape != gate_shape or down_shape != (num_experts, hidden, inter) or x.shape[-1] != hidden:
        raise ValueError(f"x {tuple(x.shape)}, gate {gate_shape}, up {up_shape}, down {down_shape}: need x [tokens, "
                         "hidden], gate and up [E, I, hidden], down [E, hidden, I]")
    if type(gate) is not type(up) or _formats(gate) != _formats(up) or _strides(gate) != _strides(up):
        raise ValueError("gate and up experts must share one format, block or group, and layout")
    if shared is not None:
        for routed, own in zip((gate, up, down), shared, strict=True):
            if (type(own) is not type(routed) or _shape(own)[1:] != _shape(routed)[1:] or _shape(own)[0] != 1
                    or _formats(own) != _formats(routed) or _strides(own)[1:3] != _strides(routed)[1:3]
                    or _strides(own)[4:6] != _strides(routed)[4:6] or _strides(own)[7:] != _strides(routed)[7:]):
                raise ValueError("the shared expert must have one routed expert's shape, format and layout (a "
                                 "leading dim of 1)")
    return num_experts + (shared is not None), hidden, inter


def quant_gate_up_silu(x: torch.Tensor, gate: QuantExperts, up: QuantExperts, sorted_pair_ids: torch.Tensor,
                       block_expert: torch.Tensor, slots: int, config: TileConfig,
                       out: torch.Tensor | None = None, shared: Shared | None = None) -> torch.Tensor:
    """x [tokens, hidden], gate and up dequantizing to [E, I, hidden] -> h [sorted rows, I] (rows of unused blocks
    unwritten); `shared`'s gate and up serve the blocks of expert E."""
    num_routed, inter, hidden = _shape(gate)
    if out is None:
        out = x.new_empty((sorted_pair_ids.numel(), inter))
    own = shared or (gate, up, None)
    grid = (block_expert.numel(), triton.cdiv(inter, config.gate_n))
    _gate_up_kernel[grid](
        x, *_pointers(gate), *_pointers(up), *_pointers(own[0]), *_pointers(own[1]), out, sorted_pair_ids,
        block_expert, x.shape[0] * slots, num_routed, x.stride(0), x.stride(1), *_strides(gate), out.stride(0),
        HIDDEN=hidden, INTER=inter, SLOTS=slots, BLOCK_M=config.block_m, BLOCK_N=config.gate_n, BLOCK_K=config.gate_k,
        PRECISION=precision(x.dtype), num_warps=config.num_warps, num_stages=config.gate_stages, **_formats(gate),
    )
    return out


def quant_down_weighted(h: torch.Tensor, down: QuantExperts, sorted_pair_ids: torch.Tensor,
                        block_expert: torch.Tensor, pair_weights: torch.Tensor, config: TileConfig,
                        out: torch.Tensor | None = None, shared: QuantExperts | None = None) -> torch.Tensor:
    """h [sorted rows, I], down dequantizing to [E, hidden, I], pair_weights [pairs] -> y [pairs, hidden], each
    pair's row weighted by its routing weight; `shared` serves the blocks of expert E."""
    num_routed, hidden, inter = _shape(down)
    num_pairs = pair_weights.numel()
    if out is None:
        out = h.new_empty((num_pairs, hidden))
    h = h.contiguous()  # the loads assume a unit-stride inner dim (free: kernel 1 writes it so)
    grid = (block_expert.numel(), triton.cdiv(hidden, config.down_n))
    _down_kernel[grid](
        h, *_pointers(down), *_pointers(shared or down), out, sorted_pair_ids, block_expert, pair_weights, num_pairs,
        num_routed, h.stride(0), *_strides(down), out.stride(0), HIDDEN=hidden, INTER=inter, BLOCK_M=config.block_m,
        BLOCK_N=config.down_n, BLOCK_K=config.down_k, PRECISION=precision(h.dtype), num_warps=config.num_warps,
        num_stages=config.down_stages, **_formats(down),
    )
    return out


def _aligned(x: torch.Tensor, sorted_pair_ids: torch.Tensor, block_expert: torch.Tensor, weights: torch.Tensor,
             gate: QuantExperts, up: QuantExperts, down: QuantExperts, config: TileConfig,
             shared: Shared | None) -> torch.Tensor:
    tokens, slots = weights.shape
    h = quant_gate_up_silu(x, gate, up, sorted_pair_ids, block_expert, slots, config, shared=shared)
    y = quant_down_weighted(h, down, sorted_pair_ids, block_expert, weights.reshape(-1).contiguous(), config,
                            shared=shared[2] if shared else None)
    return y.view(tokens, slots, x.shape[1])


def quant_fused_experts(x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, gate: QuantExperts,
                        up: QuantExperts, down: QuantExperts, block_m: int | None = None,
                        shared: Shared | None = None) -> torch.Tensor:
    """triton_moe.fused_experts over quantized experts: x [tokens, hidden]; expert_ids, weights [tokens, slots] ->
    the weighted parts [tokens, slots, hidden] in x's dtype (their sum over slots is the MoE's output). With
    `shared`, id E is the shared expert."""
    tokens, slots = expert_ids.shape
    num_experts, hidden, _ = _check(x, gate, up, down, shared)
    num_pairs = tokens * slots
    if num_pairs == 0:
        return x.new_zeros((tokens, slots, hidden))
    config = QUANT_CONFIGS[block_m or pick_block_m(num_pairs, num_experts)]
    num_blocks = num_blocks_for(num_pairs, num_experts, config.block_m)
    sorted_pair_ids, block_expert, _ = align(expert_ids, num_experts, config.block_m, num_blocks)
    return _aligned(x, sorted_pair_ids, block_expert, weights, gate, up, down, config, shared)


def quant_routed_experts(x: torch.Tensor, top_k: int, norm_topk_prob: bool, gate: QuantExperts, up: QuantExperts,
                         down: QuantExperts, *, logits: torch.Tensor | None = None,
                         router_weight: torch.Tensor | None = None, partials: torch.Tensor | None = None,
                         shared: Shared | None = None) -> torch.Tensor:
    """triton_moe.routed_experts over quantized experts: routed and aligned by the routing kernels (triton_route;
    the caller checks fits_routing_kernels, and fits_router_gemv given the weight) from the router's `logits`
    [tokens, E], or from x and `router_weight` [E, hidden] (`partials`: x's router partials made already). With
    `shared` the logits (the weight's rows) are E + 1, the last the shared gate's, and the parts gain its slot."""
    assert (logits is None) != (router_weight is None), "the logits or the router's weight, not both"
    num_experts, _, _ = _check(x, gate, up, down, shared)
    num_pairs = x.shape[0] * (top_k + (shared is not None))
    config = QUANT_CONFIGS[pick_block_m(num_pairs, num_experts)]
    num_blocks = num_blocks_for(num_pairs, num_experts, config.block_m)
    _, weights, sorted_pair_ids, block_expert, _ = route_and_align(
        x if logits is None else logits, top_k, norm_topk_prob, config.block_m, num_blocks, shared is not None,
        router_weight, partials)
    return _aligned(x, sorted_pair_ids, block_expert, weights, gate, up, down, config, shared)
