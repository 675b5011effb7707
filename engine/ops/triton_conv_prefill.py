"""GDN's short causal conv (+ SiLU) over every prefill span of a step in two Triton launches.

The PyTorch path (engine/ops/conv.py::conv_prefill) runs span by span: a cat, `kernel` multiply-adds, a SiLU,
transposes and state copies each, so a prefill of 64 prompts costs thousands of small kernels per layer. Here:

- the conv: each program computes a [BLOCK_T tokens, BLOCK_C channels] tile of any spans' tokens. Token t of the span
  (start, end, slot, continues) reads input p = t - (kernel - 1) + tap from x when p >= start, else from the span's
  history: the slot's saved state when it continues a sequence, zeros when it starts one. float32 math, one cast.
- the state: each span's new state is its last kernel - 1 inputs (the old state's newest ones mixed in when the span
  is shorter), written to its slot. A second launch, so every history read of the first is done before a slot is
  overwritten; within a program the loads precede a barrier that precedes the stores.

x is read straight from GDN's grouped projection layout through `segments` (as engine/ops/triton_gdn.py's decode
conv), or plain [tokens, channels]. Per-token and per-span metadata come from the step's host-side span list, built
once per distinct span list and device (a prefill step is not graph-captured; its 36 GDN layers share them).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch
import triton
import triton.language as tl

from engine.ops.triton_gdn import channel_offsets

BLOCK_T = 32  # tokens per conv program
BLOCK_C = 128  # channels per program (both kernels)
Span = tuple[int, int, int, bool]  # (start, end, slot, continues) in the step's flat tokens


@triton.jit
def _conv_prefill_kernel(x_ptr, weight_ptr, state_ptr, meta_ptr, out_ptr, num_rows, channels,
                         sx0, sx1, sx2, sw0, sw1, ss0, ss1, ss2, so0, so1,
                         GROUPS: tl.constexpr, SEG0: tl.constexpr, SEG1: tl.constexpr, SEG2: tl.constexpr,
                         KERNEL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    i = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    i_ok = i < num_rows
    # meta rows: the token's flat row, its span's start, slot, and whether the span continues a cached sequence.
    row = tl.load(meta_ptr + i, mask=i_ok, other=0)
    start = tl.load(meta_ptr + num_rows + i, mask=i_ok, other=0)
    slot = tl.load(meta_ptr + 2 * num_rows + i, mask=i_ok, other=0)
    continues = tl.load(meta_ptr + 3 * num_rows + i, mask=i_ok, other=0) != 0
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < channels
    x_columns = channel_offsets(c, sx1, sx2, GROUPS, SEG0, SEG1, SEG2)[None, :]
    history = state_ptr + slot[:, None] * ss0 + c[None, :].to(tl.int64) * ss1
    ok = i_ok[:, None] & c_ok[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for tap in tl.static_range(KERNEL):
        p = row - (KERNEL - 1) + tap
        from_x = p >= start
        # Addresses clamped into range on the lanes their masks drop.
        x = tl.load(x_ptr + tl.where(from_x, p, start)[:, None] * sx0 + x_columns, mask=ok & from_x[:, None],
                    other=0.0)
        back = tl.minimum(tl.maximum(KERNEL - 1 - (start - p), 0), KERNEL - 2)  # the state's tap, oldest first
        old = tl.load(history + back[:, None] * ss2, mask=ok & (~from_x & continues)[:, None], other=0.0)
        weight = tl.load(weight_ptr + c * sw0 + tap * sw1, mask=c_ok, other=0.0).to(tl.float32)
        acc += tl.where(from_x[:, None], x.to(tl.float32), old.to(tl.float32)) * weight[None, :]
    out = (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row[:, None] * so0 + c[None, :].to(tl.int64) * so1, out, mask=ok)


@triton.jit
def _conv_state_kernel(x_ptr, state_ptr, meta_ptr, num_spans, channels, sx0, sx1, sx2, ss0, ss1, ss2,
                       GROUPS: tl.constexpr, SEG0: tl.constexpr, SEG1: tl.constexpr, SEG2: tl.constexpr,
                       KERNEL: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr):
    span = tl.program_id(0)
    start = tl.load(meta_ptr + span)
    end = tl.load(meta_ptr + num_spans + span)
    slot = tl.load(meta_ptr + 2 * num_spans + span)
    continues = tl.load(meta_ptr + 3 * num_spans + span) != 0
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < channels
    tap = tl.arange(0, K_PAD)[None, :]  # the new state's tap, oldest first
    ok = c_ok[:, None] & (tap < KERNEL - 1)
    p = end - (KERNEL - 1) + tap  # the input that becomes this tap
    from_x = p >= start
    x_columns = channel_offsets(c, sx1, sx2, GROUPS, SEG0, SEG1, SEG2)[:, None]
    x = tl.load(x_ptr + tl.where(from_x, p, start) * sx0 + x_columns, mask=ok & from_x, other=0.0)
    history = state_ptr + slot * ss0 + c[:, None].to(tl.int64) * ss1
    back = tl.minimum(tap + (end - start), KERNEL - 2)  # an old tap, newer by the span's length
    old = tl.load(history + back * ss2, mask=ok & ~from_x & continues, other=0.0)
    new = tl.where(from_x, x.to(tl.float32), old.to(tl.float32))
    tl.debug_barrier()  # every old tap read before any thread of this program overwrites one
    tl.store(history + tap * ss2, new.to(state_ptr.dtype.element_ty), mask=ok)


@lru_cache(maxsize=8)
def span_tensors(spans: tuple[Span, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(per token [4, tokens]: flat row, span start, slot, continues; per span [4, spans]: start, end, slot,
    continues), int64 on `device`, from one host-to-device copy. Cached: every GDN layer of a step asks."""
    starts, ends, slots, continues = (torch.tensor(column, dtype=torch.long) for column in zip(*spans, strict=True))
    lengths = ends - starts
    span_of_token = torch.repeat_interleave(torch.arange(len(spans)), lengths)
    first_index = lengths.cumsum(0) - lengths  # each span's first position among the prefill tokens
    rows = starts[span_of_token] + torch.arange(int(lengths.sum())) - first_index[span_of_token]
    per_token = torch.stack([rows, starts[span_of_token], slots[span_of_token], continues[span_of_token]])
    per_span = torch.stack([starts, ends, slots, continues])
    both = torch.cat([per_token.flatten(), per_span.flatten()]).to(device)
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
    layout = dict(GROUPS=groups, SEG0=seg0, SEG1=seg1, SEG2=seg2, KERNEL=kernel)
    blocks = triton.cdiv(channels, BLOCK_C)
    _conv_prefill_kernel[(triton.cdiv(per_token.shape[1], BLOCK_T), blocks)](
        x, weight, conv_state, per_token, out, per_token.shape[1], channels,
        *x.stride(), *weight.stride(), *conv_state.stride(), *out.stride(),
        **layout, BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C, num_warps=4,
    )
    # Second, in stream order: the conv above has read every history before a slot is overwritten.
    _conv_state_kernel[(per_span.shape[1], blocks)](
        x, conv_state, per_span, per_span.shape[1], channels, *x.stride(), *conv_state.stride(),
        **layout, K_PAD=triton.next_power_of_2(kernel), BLOCK_C=BLOCK_C, num_warps=4,
    )
    return out
