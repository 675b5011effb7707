"""GDN's short causal conv (+ SiLU) over every prefill span of a step in two Triton launches.

The PyTorch path (engine/ops/conv.py::conv_prefill) runs span by span: a cat, `kernel` multiply-adds, a SiLU,
transposes and state copies each, so a prefill of 64 prompts costs thousands of small kernels per layer. Here:

- the body: each program computes a [block_t tokens, block_c channels] tile of any spans' tokens; token t reads inputs
  t - (kernel - 1) .. t of x, each tap one shifted tile (the halo re-read from cache). It stores every token but a
  span's first kernel - 1, the only ones that read from before the span. float32 math, one cast.
- the edges: one program per span and channel block computes those first kernel - 1 tokens, reading the history (the
  slot's saved state when the span continues a sequence, zeros when it starts one), and writes the span's new state,
  its last kernel - 1 inputs (the old state's newest ones mixed in when the span is shorter), to its slot. Its loads
  precede a barrier that precedes its stores; no other program touches that slot's channels.

The body moves ~2 bytes in and out per element: it is bound by memory bandwidth. Its channel blocks are runs of one
(group, segment) of x, found from the program id on scalars (conv_prefill_tiles picks their width): columns are a
scalar base plus a range, so loads and stores are contiguous and vectorised, where a per-channel map from channel to
(group, column) would hide that from the compiler and give 2-byte accesses.

x is read straight from GDN's grouped projection layout through `segments` (as engine/ops/triton_gdn.py's decode
conv), or plain [tokens, channels]. Per-token and per-span metadata (int32) come from the step's host-side span list,
built once per distinct span list and device (a prefill step is not graph-captured; its 36 GDN layers share them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl

BLOCK_T = 64  # tokens per body program: its (kernel - 1)-token halo is re-read once per 64
MAX_BLOCK_C = 128  # channels per program at most (a 64 x 128 float32 accumulator over 4 warps)
MIN_ALIGNED_BLOCK_C = 16  # a narrower run is too little work for a program: mask a wider one instead
NUM_WARPS = 4
Span = tuple[int, int, int, bool]  # (start, end, slot, continues) in the step's flat tokens


@dataclass(frozen=True)
class ConvTiles:
    block_t: int  # tokens per body program
    block_c: int  # channels per program (both kernels): a run within one (group, segment)
    aligned: bool  # block_c divides every segment width: runs start aligned and no lane is masked
    num_warps: int


def conv_prefill_tiles(segments: tuple[int, ...]) -> ConvTiles:
    """The tiles for segment widths `segments`: block_c is the largest power of two <= MAX_BLOCK_C dividing every
    width, so every run of block_c columns is contiguous, aligned and whole (vector loads and stores). Where no power
    of two >= MIN_ALIGNED_BLOCK_C divides them (toy layouts), runs cover the widest segment, their tails masked."""
    divisor = min(width & -width for width in segments)  # the largest power of two dividing each width
    if divisor >= MIN_ALIGNED_BLOCK_C:
        return ConvTiles(BLOCK_T, min(divisor, MAX_BLOCK_C), True, NUM_WARPS)
    return ConvTiles(BLOCK_T, min(triton.next_power_of_2(max(segments)), MAX_BLOCK_C), False, NUM_WARPS)


@triton.jit
def _channel_run(block, sx1, sx2, GROUPS: tl.constexpr, SEG0: tl.constexpr, SEG1: tl.constexpr,
                 SEG2: tl.constexpr, BLOCK_C: tl.constexpr, ALIGNED: tl.constexpr):
    """Channel block `block`: BLOCK_C consecutive columns of one group's segment, blocks ordered as the conv channels
    (each segment's columns of every group in turn). Returns (its conv channels, their offsets within a row of x,
    which lanes are real columns), all [BLOCK_C]."""
    per0 = (SEG0 + BLOCK_C - 1) // BLOCK_C  # blocks per group in each segment
    per1 = (SEG1 + BLOCK_C - 1) // BLOCK_C
    per2 = (SEG2 + BLOCK_C - 1) // BLOCK_C
    in0 = block < GROUPS * per0
    in1 = block < GROUPS * (per0 + per1)
    local = block - tl.where(in0, 0, tl.where(in1, GROUPS * per0, GROUPS * (per0 + per1)))
    per = tl.where(in0, per0, tl.where(in1, per1, per2))
    group = local // per
    offset = (local % per) * BLOCK_C  # the run's first column within its segment
    width = tl.where(in0, SEG0, tl.where(in1, SEG1, SEG2))
    channel = tl.where(in0, 0, tl.where(in1, GROUPS * SEG0, GROUPS * (SEG0 + SEG1))) + group * width + offset
    column = tl.where(in0, 0, tl.where(in1, SEG0, SEG0 + SEG1)) + offset
    lanes = tl.arange(0, BLOCK_C)
    if ALIGNED:
        channel = tl.multiple_of(channel, BLOCK_C)
        column = tl.multiple_of(column, BLOCK_C)
        lane_ok = tl.full([BLOCK_C], 1, tl.int1)
    else:
        lane_ok = offset + lanes < width
    return channel + lanes, group.to(tl.int64) * sx1 + (column + lanes).to(tl.int64) * sx2, lane_ok


@triton.jit
def _conv_prefill_kernel(x_ptr, weight_ptr, meta_ptr, out_ptr, num_rows, sx0, sx1, sx2, sw0, sw1, so0, so1,
                         GROUPS: tl.constexpr, SEG0: tl.constexpr, SEG1: tl.constexpr, SEG2: tl.constexpr,
                         KERNEL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, ALIGNED: tl.constexpr):
    c, x_columns, c_ok = _channel_run(tl.program_id(0), sx1, sx2, GROUPS, SEG0, SEG1, SEG2, BLOCK_C, ALIGNED)
    i = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    i_ok = i < num_rows
    row = tl.load(meta_ptr + i, mask=i_ok, other=0)  # the token's flat row
    start = tl.load(meta_ptr + num_rows + i, mask=i_ok, other=0)  # its span's first row
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for tap in tl.static_range(KERNEL):
        # Rows clamped into the span: exact for the rows stored, in range for the others (a span's head, padding).
        x_rows = tl.maximum(row - (KERNEL - 1) + tap, start).to(tl.int64) * sx0
        x = tl.load(x_ptr + x_rows[:, None] + x_columns[None, :], mask=c_ok[None, :], other=0.0)
        weight = tl.load(weight_ptr + c * sw0 + tap * sw1, mask=c_ok, other=0.0).to(tl.float32)
        acc += x.to(tl.float32) * weight[None, :]
    out = (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty)
    body = i_ok & (row - start >= KERNEL - 1)  # a span's first KERNEL - 1 tokens are the edges kernel's
    tl.store(out_ptr + row.to(tl.int64)[:, None] * so0 + c[None, :] * so1, out, mask=body[:, None] & c_ok[None, :])


@triton.jit
def _conv_span_edges_kernel(x_ptr, weight_ptr, state_ptr, meta_ptr, out_ptr, num_spans,
                            sx0, sx1, sx2, sw0, sw1, ss0, ss1, ss2, so0, so1,
                            GROUPS: tl.constexpr, SEG0: tl.constexpr, SEG1: tl.constexpr, SEG2: tl.constexpr,
                            KERNEL: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr, ALIGNED: tl.constexpr):
    c, x_columns, c_ok = _channel_run(tl.program_id(0), sx1, sx2, GROUPS, SEG0, SEG1, SEG2, BLOCK_C, ALIGNED)
    span = tl.program_id(1)
    start = tl.load(meta_ptr + span)
    end = tl.load(meta_ptr + num_spans + span)
    slot = tl.load(meta_ptr + 2 * num_spans + span)
    continues = tl.load(meta_ptr + 3 * num_spans + span) != 0
    j = tl.arange(0, K_PAD)[:, None]  # the span's token start + j; the new state's tap j (oldest first)
    history = state_ptr + slot.to(tl.int64) * ss0 + c[None, :].to(tl.int64) * ss1
    # The head: token start + j reads input start + q, q = j - (KERNEL - 1) + tap, from the history when q < 0.
    head = (j < KERNEL - 1) & (j < end - start) & c_ok[None, :]
    acc = tl.zeros((K_PAD, BLOCK_C), dtype=tl.float32)
    for tap in tl.static_range(KERNEL):
        q = j - (KERNEL - 1) + tap
        from_x = q >= 0
        x = tl.load(x_ptr + (start + tl.maximum(q, 0)).to(tl.int64) * sx0 + x_columns[None, :],
                    mask=head & from_x, other=0.0)
        old = tl.load(history + tl.minimum(q + KERNEL - 1, KERNEL - 2) * ss2, mask=head & ~from_x & continues,
                      other=0.0)
        weight = tl.load(weight_ptr + c * sw0 + tap * sw1, mask=c_ok, other=0.0).to(tl.float32)
        acc += tl.where(from_x, x.to(tl.float32), old.to(tl.float32)) * weight[None, :]
    # The new state: the last KERNEL - 1 inputs, the old state's newest ones where the span is shorter.
    keep = (j < KERNEL - 1) & c_ok[None, :]
    p = end - (KERNEL - 1) + j  # the input that becomes tap j
    in_span = p >= start
    x = tl.load(x_ptr + tl.maximum(p, start).to(tl.int64) * sx0 + x_columns[None, :], mask=keep & in_span,
                other=0.0)
    back = tl.minimum(j + (end - start), KERNEL - 2)  # an old tap, newer by the span's length
    old = tl.load(history + back * ss2, mask=keep & ~in_span & continues, other=0.0)
    new = tl.where(in_span, x.to(tl.float32), old.to(tl.float32))
    tl.debug_barrier()  # every old tap read before any thread of this program overwrites one
    tl.store(history + j * ss2, new.to(state_ptr.dtype.element_ty), mask=keep)
    out = (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + (start + j).to(tl.int64) * so0 + c[None, :] * so1, out, mask=head)


@lru_cache(maxsize=8)
def span_tensors(spans: tuple[Span, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(per token [2, tokens]: flat row, span start; per span [4, spans]: start, end, slot, continues), int32 on
    `device`, from one host-to-device copy. Cached: every GDN layer of a step asks."""
    starts, ends, slots, continues = (torch.tensor(column, dtype=torch.long) for column in zip(*spans, strict=True))
    lengths = ends - starts
    span_of_token = torch.repeat_interleave(torch.arange(len(spans)), lengths)
    first_index = lengths.cumsum(0) - lengths  # each span's first position among the prefill tokens
    rows = starts[span_of_token] + torch.arange(int(lengths.sum())) - first_index[span_of_token]
    per_token = torch.stack([rows, starts[span_of_token]])
    per_span = torch.stack([starts, ends, slots, continues])
    both = torch.cat([per_token.flatten(), per_span.flatten()]).to(device, torch.int32)
    return both[:per_token.numel()].view(per_token.shape), both[per_token.numel():].view(per_span.shape)


def triton_conv_prefill(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, spans: Sequence[Span],
                        segments: tuple[int, ...] | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Every prefill span (start, end, slot, continues) of a step: x [tokens, channels], or with `segments` (at most
    three widths) [tokens, groups, width] whose conv channels are each segment's columns of every group in turn; any
    strides. weight [channels, kernel]; conv_state [num_slots, channels, kernel - 1] (oldest first): each span reads
    its slot's history (when it continues) and leaves its last kernel - 1 inputs there; the spans' slots must be
    distinct. Returns silu(conv) [tokens, channels] in x's dtype, written at the spans' rows only (into `out` if
    given; other rows of a new tensor are left unset)."""
    if segments is None:
        x, segments = x.unsqueeze(1), (x.shape[-1],)
    if len(segments) > 3:
        raise ValueError(f"at most three segments, got {segments}")
    seg0, seg1, seg2 = (*segments, 0, 0)[:3]
    groups = x.shape[1]
    channels, kernel = weight.shape
    if groups * sum(segments) != channels or sum(segments) > x.shape[2]:
        raise ValueError(f"x {tuple(x.shape)} with segments {segments} does not give {channels} channels")
    if kernel < 2:
        raise ValueError(f"a conv kernel of {kernel} keeps no state")
    out = torch.empty((x.shape[0], channels), dtype=x.dtype, device=x.device) if out is None else out
    if not spans:
        return out
    per_token, per_span = span_tensors(tuple(spans), x.device)
    tiles = conv_prefill_tiles(tuple(segments))
    layout = dict(GROUPS=groups, SEG0=seg0, SEG1=seg1, SEG2=seg2, KERNEL=kernel, BLOCK_C=tiles.block_c,
                  ALIGNED=tiles.aligned, num_warps=tiles.num_warps)
    blocks = groups * sum(triton.cdiv(width, tiles.block_c) for width in segments)  # one run of a segment each
    # Channel blocks fastest: programs running together cover whole rows of x.
    _conv_prefill_kernel[(blocks, triton.cdiv(per_token.shape[1], tiles.block_t))](
        x, weight, per_token, out, per_token.shape[1], *x.stride(), *weight.stride(), *out.stride(),
        **layout, BLOCK_T=tiles.block_t,
    )
    _conv_span_edges_kernel[(blocks, per_span.shape[1])](
        x, weight, conv_state, per_span, out, per_span.shape[1],
        *x.stride(), *weight.stride(), *conv_state.stride(), *out.stride(),
        **layout, K_PAD=triton.next_power_of_2(kernel - 1),
    )
    return out
