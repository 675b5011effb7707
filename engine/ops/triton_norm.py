"""RMSNorm as one Triton kernel per call: the residual add folded in, and GDN's gated form.

Eager (or torch.compile'd) the pre-norm residual stream costs an add and a norm per sublayer, each a launch; here one
program per row reads x and the residual once, writes the sum back into the residual (in place) and the normed row.
Math is float32 and the roundings follow engine/layers/norm.py exactly: the sum is rounded to the input dtype (as the
eager `x + mixer(x)` is), Llama's norm casts the normed row before scaling by w, Qwen3-Next's scales by (1 + w) in
float32 and casts last, and the gated form rounds after the weight and again at the end.

Rows are every leading dim flattened; a tensor is seen as [outer, inner, width] with its own two row strides, so the
per-head q/k norm reads a strided slice of the projection output without a copy (and the gated norm's gate may have
one more level: GDN's z, heads grouped per key head).
What is added to the residual may come as parts [..., P, width] (an MoE's weighted expert outputs, see
engine/layers/moe.py): the program reads its row's P parts (a constexpr loop, with their stride), sums them in float32
and rounds the sum once to the dtype, then adds it to the residual as above: the MoE's top-k sum costs no launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _row_offset(row, inner, stride_outer, stride_inner):
    return (row // inner).to(tl.int64) * stride_outer + (row % inner).to(tl.int64) * stride_inner


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, residual_out_ptr, weight_ptr, out_ptr, inner, width, eps,
                     sx0, sx1, sxp, sr0, sr1, sq0, sq1, so0, so1,
                     HAS_RESIDUAL: tl.constexpr, ONE_CENTRED: tl.constexpr, PARTS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < width
    x_row = x_ptr + _row_offset(row, inner, sx0, sx1)
    x = tl.load(x_row + cols, mask=ok, other=0.0)
    if PARTS > 1:
        total = x.to(tl.float32)
        for part in tl.static_range(1, PARTS):
            total += tl.load(x_row + part * sxp + cols, mask=ok, other=0.0).to(tl.float32)
        x = total.to(x.dtype)  # the parts' sum, rounded once as the eager x.float().sum(-2).to(dtype)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + _row_offset(row, inner, sr0, sr1) + cols, mask=ok, other=0.0)
        x = (residual.to(tl.float32) + x.to(tl.float32)).to(x.dtype)  # rounded as the eager add rounds
        tl.store(residual_out_ptr + _row_offset(row, inner, sq0, sq1) + cols, x, mask=ok)
    summed = x.to(tl.float32)
    normed = summed * tl.rsqrt(tl.sum(summed * summed, axis=0) / width + eps)
    weight = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    # Qwen3-Next scales in float32; Llama rounds the normed row to the input dtype before the weight.
    y = normed * (1.0 + weight) if ONE_CENTRED else weight * normed.to(x.dtype).to(tl.float32)
    tl.store(out_ptr + _row_offset(row, inner, so0, so1) + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _gated_rms_norm_kernel(x_ptr, gate_ptr, weight_ptr, out_ptr, inner, width, eps, sx0, sx1, sg0, sg1, sg2,
                           so0, so1, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < width
    x = tl.load(x_ptr + _row_offset(row, inner, sx0, sx1) + cols, mask=ok, other=0.0)
    values = x.to(tl.float32)
    normed = (values * tl.rsqrt(tl.sum(values * values, axis=0) / width + eps)).to(x.dtype)
    weight = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    scaled = (weight * normed.to(tl.float32)).to(x.dtype)  # eager: weight * normed in the input dtype
    # The gate's inner rows come in groups of GROUP, each level with its own stride (GROUP 1: plain rows).
    within = row % inner
    gate_row = gate_ptr + (row // inner).to(tl.int64) * sg0 + (within // GROUP).to(tl.int64) * sg1
    gate = tl.load(gate_row + (within % GROUP).to(tl.int64) * sg2 + cols, mask=ok, other=0.0).to(tl.float32)
    y = scaled.to(tl.float32) * (gate * tl.sigmoid(gate))
    tl.store(out_ptr + _row_offset(row, inner, so0, so1) + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def _as_rows(t: torch.Tensor, parts: bool = False) -> torch.Tensor:
    """A view [outer, inner, width] of t (with `parts`, t [..., P, width] -> [outer, inner, P, width]) with a unit
    last stride (a copy only where no such view exists)."""
    lead = t.dim() - (2 if parts else 1)
    if lead == 0:
        t = t[None, None]
    elif lead == 1:
        t = t[:, None]
    elif lead > 2:
        t = t.reshape(-1, *t.shape[lead - 1:])
    return t if t.stride(-1) == 1 else t.contiguous()


def _written_rows(t: torch.Tensor, like: torch.Tensor, name: str) -> torch.Tensor:
    """Rows of a tensor the kernel writes: it must have x's shape and dtype and be viewable as rows without a copy."""
    if t.shape != like.shape or t.dtype != like.dtype:
        raise ValueError(f"{name} {tuple(t.shape)} {t.dtype} does not match x {tuple(like.shape)} {like.dtype}")
    rows = _as_rows(t)
    if rows.data_ptr() != t.data_ptr():
        raise ValueError(f"{name} must be viewable as [rows, width] with a unit last stride: the kernel writes it")
    return rows


FEW_ROWS = 512  # a decode batch's rows at most; a prefill chunk's are thousands


def _launch_shape(width: int, parts: int = 1, rows: int = 1) -> tuple[int, int]:
    """BLOCK covers the row; about four elements a thread, up to eight warps, or sixteen where a decode step's rows
    sum parts (more loads in flight: 1.9 us against 2.7 at 8 warps for one row of nine parts at width 2048 on the
    H200, benchmarks/decode_tiles.py; a plain row is no faster past 8). Prefill keeps the 8 warps it was measured
    with: its thousands of rows fill the card either way."""
    block = triton.next_power_of_2(width)
    return block, min(16 if parts > 1 and rows <= FEW_ROWS else 8, max(1, block // 128))


def triton_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, one_centred: bool,
                    residual: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
                    out: torch.Tensor | None = None, num_warps: int | None = None) -> torch.Tensor:
    """RMSNorm over the last dim of x; with `residual` (x's shape) it normalises residual + x instead and writes that
    sum into `residual_out` (default: `residual` itself, in place). With a residual, x may also be parts
    [..., P, width] (residual [..., width]): residual + their sum, the sum taken in float32 and rounded once. Returns
    the normed tensor (`out` if given), of the residual's shape. `num_warps` overrides the launch's (benchmarks)."""
    parts = residual is not None and x.dim() == residual.dim() + 1
    if parts and x.shape[:-2] + x.shape[-1:] != residual.shape:
        raise ValueError(f"parts {tuple(x.shape)} do not match the residual {tuple(residual.shape)}")
    like = residual if parts else x  # the shape of a row's sum, the output and the residual written
    width = x.shape[-1]
    out = torch.empty_like(like, memory_format=torch.contiguous_format) if out is None else out
    xs, os_ = _as_rows(x, parts), _written_rows(out, like, "out")
    if residual is None:
        rs = qs = xs  # never read: HAS_RESIDUAL is off
    else:
        rs = _as_rows(residual)
        qs = _written_rows(residual if residual_out is None else residual_out, like, "residual_out")
    rows = os_.shape[0] * os_.shape[1]
    block, warps = _launch_shape(width, x.shape[-2] if parts else 1, rows)
    if rows == 0:  # an empty batch: nothing to launch
        return out
    _rms_norm_kernel[(rows,)](
        xs, rs, qs, weight.contiguous(), os_, os_.shape[1], width, eps,
        xs.stride(0), xs.stride(1), xs.stride(2) if parts else 0, rs.stride(0), rs.stride(1), qs.stride(0),
        qs.stride(1), os_.stride(0), os_.stride(1), HAS_RESIDUAL=residual is not None, ONE_CENTRED=one_centred,
        PARTS=x.shape[-2] if parts else 1, BLOCK=block, num_warps=num_warps or warps,
    )
    return out


def triton_gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """GDN's gated RMSNorm over the last dim: weight * normalise(x), times silu(gate). The gate has x's shape, or
    x [..., heads, width] takes a grouped gate [..., groups, per_group, width] (groups * per_group = heads): GDN's z
    read where the projection lays it out, per key head, which no [..., heads, width] view can describe.
    Returns `out` (allocated if not given), in x's dtype."""
    grouped = gate.dim() == x.dim() + 1
    if grouped:
        fits = x.dim() >= 2 and gate.shape[:-3] == x.shape[:-2] and gate.shape[-1] == x.shape[-1] and (
            gate.shape[-3] * gate.shape[-2] == x.shape[-2])
    else:
        fits = gate.shape == x.shape
    if not fits:
        raise ValueError(f"gate {tuple(gate.shape)} does not match x {tuple(x.shape)}")
    width = x.shape[-1]
    out = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    xs, gs, os_ = _as_rows(x), _as_rows(gate, parts=grouped), _written_rows(out, x, "out")
    rows, (block, warps) = xs.shape[0] * xs.shape[1], _launch_shape(width)
    if rows == 0:
        return out
    group_strides = (gs.stride(1), gs.stride(2)) if grouped else (gs.stride(1), 0)
    _gated_rms_norm_kernel[(rows,)](
        xs, gs, weight.contiguous(), os_, xs.shape[1], width, eps, xs.stride(0), xs.stride(1), gs.stride(0),
        *group_strides, os_.stride(0), os_.stride(1), GROUP=gate.shape[-2] if grouped else 1, BLOCK=block,
        num_warps=warps,
    )
    return out
