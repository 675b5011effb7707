"""Attention's q/k RMSNorm, neox rotary and the K/V cache write as one Triton launch (a decode step's five kernels).

Between the qkv GEMM and paged attention, a step used to launch the q norm, the k norm, two compiled rotary kernels
and the K/V write: at batch 1 each costs far more in launch latency than in bytes. Here one program per (token, head)
does a head's whole row: the grid's head axis runs over the query heads, then the kv heads. A query program normalises
its row, rotates it and stores it to a new contiguous q; a kv program does the same to its key row and stores it
straight into the paged K cache at the token's slot, and copies the value row into the V cache.

Roundings follow the eager code step for step, so in half precision the result is the eager one's up to the norm's
float32 reduction order: the norm as engine/layers/norm.py (float32 math; Qwen3-Next's one-centred form scales in
float32 and rounds last, Llama/Qwen3's rounds the normed row before the weight), its output rounded to the input dtype;
then rotary as apply_rotary computes it eagerly in the input dtype (each product rounded, then the sum); the cache
write casts through float32 to the cache's dtype (fp8 included) as engine/ops/triton_decode.py's write does.

The neox rotation pairs channel i with i + rotary_dim/2 among the leading rotary_dim channels; the rest pass through.
A program reads its row twice, as itself and as each channel's partner, and normalises both with the row's one rms.
q, k and v are read in place through their strides (gated attention's query is a view with head stride 2*head_dim).

The layer calls it on CUDA decode steps in half precision (engine/layers/attention.py). There it replaces apply_rotary
as compiled by Inductor, which keeps the products in float32 and rounds once: that path and this kernel differ by up to
a bf16 step; this kernel is the eager reference's rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _normed(raw, weight_ptr, channels, mask, inv_rms, NORM: tl.constexpr, ONE_CENTRED: tl.constexpr):
    """raw (a row as loaded) scaled by the row's inverse rms and the norm's weight at `channels`, in raw's dtype."""
    if not NORM:
        return raw
    normed = raw.to(tl.float32) * inv_rms
    weight = tl.load(weight_ptr + channels, mask=mask, other=0.0).to(tl.float32)
    if ONE_CENTRED:  # Qwen3-Next: (1 + w) in float32, rounded last
        return (normed * (1.0 + weight)).to(raw.dtype)
    # Llama/Qwen3: the normed row rounded to the dtype first, then w times it (a product in the dtype)
    return (weight * normed.to(raw.dtype).to(tl.float32)).to(raw.dtype)


@triton.jit
def _norm_rotate(row_ptr, weight_ptr, cos, sin, d, partner, ok, rotates, first_half, eps, HEAD_DIM: tl.constexpr,
                 NORM: tl.constexpr, ONE_CENTRED: tl.constexpr):
    """One head's row [D_PAD] normalised and rotated, in the input's dtype (masked channels: anything)."""
    raw = tl.load(row_ptr + d, mask=ok, other=0.0)
    values = raw.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(values * values, axis=0) / HEAD_DIM + eps)  # unused without a norm
    x = _normed(raw, weight_ptr, d, ok, inv_rms, NORM, ONE_CENTRED)
    mate = _normed(tl.load(row_ptr + partner, mask=rotates, other=0.0), weight_ptr, partner, rotates, inv_rms, NORM,
                   ONE_CENTRED)
    # Eager rotary in the dtype: x*cos and rotate_half(x)*sin each rounded, then their sum rounded.
    straight = (x.to(tl.float32) * cos).to(x.dtype).to(tl.float32)
    turned = (mate.to(tl.float32) * sin).to(x.dtype).to(tl.float32)
    rotated = (straight + tl.where(first_half, -turned, turned)).to(x.dtype)
    return tl.where(rotates, rotated, x)


@triton.jit
def _qk_kernel(q_ptr, k_ptr, v_ptr, q_weight_ptr, k_weight_ptr, cos_ptr, sin_ptr, slot_ptr, q_out_ptr, k_cache_ptr,
               v_cache_ptr, eps, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct,
               stride_st, stride_ot, stride_oh, stride_kb, stride_kr, stride_kch, stride_vb, stride_vr, stride_vch,
               NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, ROTARY_DIM: tl.constexpr,
               BLOCK_SIZE: tl.constexpr, NORM: tl.constexpr, ONE_CENTRED: tl.constexpr):
    token, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    d = tl.arange(0, D_PAD)
    half = ROTARY_DIM // 2
    ok, rotates, first_half = d < HEAD_DIM, d < ROTARY_DIM, d < half
    partner = tl.where(first_half, d + half, d - half)
    cos = tl.load(cos_ptr + token * stride_ct + d, mask=rotates, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + token * stride_st + d, mask=rotates, other=0.0).to(tl.float32)
    if head < NUM_HEADS:
        row = q_ptr + token * stride_qt + head * stride_qh
        out = _norm_rotate(row, q_weight_ptr, cos, sin, d, partner, ok, rotates, first_half, eps, HEAD_DIM, NORM,
                           ONE_CENTRED)
        tl.store(q_out_ptr + token * stride_ot + head * stride_oh + d, out, mask=ok)
    else:
        kv_head = head - NUM_HEADS
        row = k_ptr + token * stride_kt + kv_head * stride_kh
        out = _norm_rotate(row, k_weight_ptr, cos, sin, d, partner, ok, rotates, first_half, eps, HEAD_DIM, NORM,
                           ONE_CENTRED)
        slot = tl.load(slot_ptr + token).to(tl.int64)
        page, slot_row = slot // BLOCK_SIZE, slot % BLOCK_SIZE
        # Through float32: one rounding to the cache's dtype, to nearest even (fp8 included), as torch's cast.
        tl.store(k_cache_ptr + page * stride_kb + slot_row * stride_kr + kv_head * stride_kch + d,
                 out.to(tl.float32).to(k_cache_ptr.dtype.element_ty), mask=ok)
        value = tl.load(v_ptr + token * stride_vt + kv_head * stride_vh + d, mask=ok)
        tl.store(v_cache_ptr + page * stride_vb + slot_row * stride_vr + kv_head * stride_vch + d,
                 value.to(tl.float32).to(v_cache_ptr.dtype.element_ty), mask=ok)


def triton_qk_norm_rotary_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                                sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                slot_mapping: torch.Tensor, q_weight: torch.Tensor | None = None,
                                k_weight: torch.Tensor | None = None, eps: float = 0.0,
                                one_centred: bool = False) -> torch.Tensor:
    """q [tokens, heads, head_dim], k/v [tokens, kv_heads, head_dim] (any strides but a unit last one); cos/sin
    [tokens, rotary_dim]; caches [blocks, block_size, kv_heads, head_dim]; slot_mapping [tokens] (the cache row of
    each token). With q_weight/k_weight (both or neither) each head is RMS-normalised first. Writes the rotated keys
    and the values into the caches and returns the rotated queries as a new contiguous tensor in q's dtype."""
    tokens, heads, head_dim = q.shape
    kv_heads, rotary_dim = k.shape[1], cos.shape[-1]
    if (q_weight is None) != (k_weight is None):
        raise ValueError("q_weight and k_weight come together: both heads are normalised or neither")
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and at most head_dim {head_dim}")
    if any(t.stride(-1) != 1 for t in (q, k, v, cos, sin, k_cache, v_cache)):
        raise ValueError("q, k, v, cos, sin and the caches need a unit stride along their last dim")
    if any(t is not None and t.dtype != q.dtype for t in (k, v, cos, sin, q_weight, k_weight)):
        raise ValueError(f"k, v, cos, sin and the norm weights must have q's dtype {q.dtype}: eager rounds to it")
    norm = q_weight is not None
    out = q.new_empty((tokens, heads, head_dim))
    if tokens == 0:
        return out
    # Without a norm the weight pointers only carry the dtype: q itself stands in (never read).
    q_weight, k_weight = (q_weight.contiguous(), k_weight.contiguous()) if norm else (q, q)
    d_pad = triton.next_power_of_2(head_dim)
    _qk_kernel[(tokens, heads + kv_heads)](
        q, k, v, q_weight, k_weight, cos, sin, slot_mapping, out, k_cache, v_cache, eps, q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0), out.stride(0),
        out.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), NUM_HEADS=heads, HEAD_DIM=head_dim, D_PAD=d_pad, ROTARY_DIM=rotary_dim,
        BLOCK_SIZE=k_cache.shape[1], NORM=norm, ONE_CENTRED=one_centred, num_warps=min(8, max(1, d_pad // 128)),
    )
    return out
