"""GDN's decode step as two Triton kernels that update each sequence's state slot in place.

The PyTorch decode path gathers the states of the step's slots (recurrent_state[slots] copies 32 x 128 x 128 values a
sequence), steps them and scatters them back: the state crosses memory four times, in four kernels. Here each program
reads its rows of the slot through the slot index, steps them in registers (float32) and writes them back once.

- conv: the short causal depthwise conv + SiLU of one token per sequence, its window sliding in place. It reads its
  input straight from the projection's grouped layout (per key head: q | k | v | z) through `segments`, so the
  ungrouping copies (reshapes and a cat) disappear too.
- GDN: the gated delta rule (engine/ops/gdn.py::gated_delta_step) with the gates (gdn_gates) computed inside.

Rows that share a slot are copies (a CUDA graph pads a batch with copies of its first sequence): only the first
computes and writes the state, and its output goes to every copy, so copies give the same values and no program
reads a state another has already advanced. Loads precede a barrier that precedes the stores, so a state element is
read before any thread of its program overwrites it. No host synchronisation: the wrappers can be graph-captured.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (value columns per GDN program, warps), by batch: measured on the H200 (benchmarks/kernel_speed.py, CUDA-graph
# timed, 2026-12-03): at batch 1 [key_dim, 32] tiles in 4 warps (3.43 us; 64 columns 3.54 us: half the programs, and
# 64 of them leave most of the card idle), at batch 64 [key_dim, 64] in 4 warps (56.5 us vs 67.4 us with 32 columns;
# whole 128-column heads in 8 warps 73.7 us). Wide tiles from WIDE_FROM_SEQS sequences, where even they fill the card.
NARROW_TILE, WIDE_TILE = (32, 4), (64, 4)
WIDE_FROM_SEQS = 8
BLOCK_C = 256  # channels per conv program
COPY_ROWS = 16  # rows scanned at a time when an output goes to a slot's copies


@triton.jit
def _slot_of_row(slots_ptr, seq, num_seqs, SEQS_PAD: tl.constexpr):
    """(this row's slot, whether no earlier row has it, whether a later row has it)."""
    rows = tl.arange(0, SEQS_PAD)
    slot = tl.load(slots_ptr + seq)
    same = tl.load(slots_ptr + rows, mask=rows < num_seqs, other=-1) == slot
    earlier = tl.sum((same & (rows < seq)).to(tl.int32), axis=0)
    later = tl.sum((same & (rows > seq)).to(tl.int32), axis=0)
    return slot, earlier == 0, later > 0


@triton.jit
def _store_to_copies(out_ptr, value, column_offsets, column_mask, slots_ptr, slot, seq, num_seqs, stride_row,
                     COPY_ROWS: tl.constexpr):
    """Write `value` into the output row of every later row whose slot is `slot`."""
    start = seq + 1
    while start < num_seqs:  # a while loop: Triton's interpreter cannot range() over a runtime bound
        rows = start + tl.arange(0, COPY_ROWS)
        copy = tl.load(slots_ptr + rows, mask=rows < num_seqs, other=-1) == slot
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_row + column_offsets[None, :], value[None, :],
                 mask=copy[:, None] & column_mask[None, :])
        start += COPY_ROWS


@triton.jit
def channel_offsets(c, sx1, sx2, GROUPS: tl.constexpr, SEG0: tl.constexpr, SEG1: tl.constexpr, SEG2: tl.constexpr):
    """Offset of conv channel c within a row of x [.., groups, width]: channel c is column `column` of group `group`,
    segment by segment, every group in turn (GDN's q, k, v of each key head, read as the projection lays them out)."""
    end0 = GROUPS * SEG0
    end1 = end0 + GROUPS * SEG1
    in0, in1 = c < end0, c < end1
    width = tl.maximum(tl.where(in0, SEG0, tl.where(in1, SEG1, SEG2)), 1)  # >= 1: tail lanes past the end
    local = c - tl.where(in0, 0, tl.where(in1, end0, end1))
    column = tl.where(in0, 0, tl.where(in1, SEG0, SEG0 + SEG1)) + local % width
    return (local // width).to(tl.int64) * sx1 + column.to(tl.int64) * sx2


@triton.jit
def _conv_decode_kernel(x_ptr, weight_ptr, state_ptr, slots_ptr, out_ptr, num_seqs, channels,
                        sx0, sx1, sx2, sw0, sw1, ss0, ss1, ss2, so0, so1,
                        GROUPS: tl.constexpr, SEG0: tl.constexpr, SEG1: tl.constexpr, SEG2: tl.constexpr,
                        KERNEL: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr, SEQS_PAD: tl.constexpr,
                        COPY_ROWS: tl.constexpr):
    seq, block = tl.program_id(0), tl.program_id(1)
    slot, first, has_copies = _slot_of_row(slots_ptr, seq, num_seqs, SEQS_PAD)
    if first:
        row = seq.to(tl.int64)
        c = block * BLOCK_C + tl.arange(0, BLOCK_C)
        c_ok = c < channels
        x = tl.load(x_ptr + row * sx0 + channel_offsets(c, sx1, sx2, GROUPS, SEG0, SEG1, SEG2), mask=c_ok, other=0.0)
        tap = tl.arange(0, K_PAD)[None, :]
        history = state_ptr + slot * ss0 + c[:, None] * ss1
        old = tl.load(history + tap * ss2, mask=c_ok[:, None] & (tap < KERNEL - 1), other=0.0)
        window = tl.where(tap == KERNEL - 1, x.to(tl.float32)[:, None], old.to(tl.float32))  # oldest first
        weight = tl.load(weight_ptr + c[:, None] * sw0 + tap * sw1, mask=c_ok[:, None] & (tap < KERNEL), other=0.0)
        acc = tl.sum(window * weight.to(tl.float32), axis=1)
        out = (acc * tl.sigmoid(acc)).to(out_ptr.dtype.element_ty)
        tl.debug_barrier()
        # Slide by one: tap t moves to t - 1, the new input becomes the newest.
        tl.store(history + tl.maximum(tap - 1, 0) * ss2, window.to(state_ptr.dtype.element_ty),
                 mask=c_ok[:, None] & (tap >= 1) & (tap < KERNEL))
        tl.store(out_ptr + row * so0 + c * so1, out, mask=c_ok)
        if has_copies:
            _store_to_copies(out_ptr, out, c * so1, c_ok, slots_ptr, slot, seq, num_seqs, so0, COPY_ROWS)


@triton.jit
def _gdn_decode_kernel(q_ptr, k_ptr, v_ptr, b_ptr, a_ptr, a_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, out_ptr,
                       num_seqs, scale, sq0, sq1, sq2, sk0, sk1, sk2, sv0, sv1, sv2, sb0, sb1, sb2, sa0, sa1, sa2,
                       ss0, ss1, ss2, ss3, so0, so1, so2,
                       GROUP: tl.constexpr, KEY_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, K_PAD: tl.constexpr,
                       BLOCK_V: tl.constexpr, SEQS_PAD: tl.constexpr, COPY_ROWS: tl.constexpr):
    seq, head, block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot, first, has_copies = _slot_of_row(slots_ptr, seq, num_seqs, SEQS_PAD)
    if first:
        row = seq.to(tl.int64)
        key_head, sub = head // GROUP, head % GROUP  # consecutive value heads share a key head
        kd = tl.arange(0, K_PAD)
        k_ok = kd < KEY_DIM
        vd = block * BLOCK_V + tl.arange(0, BLOCK_V)
        v_ok = vd < VALUE_DIM
        q = tl.load(q_ptr + row * sq0 + key_head * sq1 + kd * sq2, mask=k_ok, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + row * sk0 + key_head * sk1 + kd * sk2, mask=k_ok, other=0.0).to(tl.float32)
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        # The gates: beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) (softplus linear past 20, as torch's).
        beta = tl.sigmoid(tl.load(b_ptr + row * sb0 + key_head * sb1 + sub * sb2).to(tl.float32))
        shifted = tl.load(a_ptr + row * sa0 + key_head * sa1 + sub * sa2).to(tl.float32)
        shifted += tl.load(dt_bias_ptr + head).to(tl.float32)
        softplus = tl.where(shifted > 20.0, shifted, tl.log(1.0 + tl.exp(tl.minimum(shifted, 20.0))))
        decay = tl.exp(-tl.exp(tl.load(a_log_ptr + head).to(tl.float32)) * softplus)
        v = tl.load(v_ptr + row * sv0 + head * sv1 + vd * sv2, mask=v_ok, other=0.0).to(tl.float32)
        tile = state_ptr + slot * ss0 + head * ss1 + kd[:, None] * ss2 + vd[None, :] * ss3
        mask = k_ok[:, None] & v_ok[None, :]
        state = tl.load(tile, mask=mask, other=0.0).to(tl.float32) * decay
        correction = beta * (v - tl.sum(state * k[:, None], axis=0))
        state += k[:, None] * correction[None, :]
        out = tl.sum(state * q[:, None], axis=0).to(out_ptr.dtype.element_ty)
        tl.debug_barrier()
        tl.store(tile, state.to(state_ptr.dtype.element_ty), mask=mask)
        columns = head * so1 + vd * so2
        tl.store(out_ptr + row * so0 + columns, out, mask=v_ok)
        if has_copies:
            _store_to_copies(out_ptr, out, columns, v_ok, slots_ptr, slot, seq, num_seqs, so0, COPY_ROWS)


def triton_conv_decode(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
                       segments: tuple[int, ...] | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """One token per sequence. x [seqs, channels], or with `segments` (at most three widths) [seqs, groups, width]
    whose conv channels are each segment's columns of every group in turn (GDN: q, k, v of each key head); any
    strides. weight [channels, kernel]; state [num_slots, channels, kernel - 1] (oldest first), slid in place at
    rows `slots` [seqs] (rows sharing a slot must be copies). Returns silu(conv) [seqs, channels] in x's dtype
    (written into `out` if given)."""
    if segments is None:
        x, segments = x.unsqueeze(1), (x.shape[-1],)
    if len(segments) > 3:
        raise ValueError(f"at most three segments, got {segments}")
    seg0, seg1, seg2 = (*segments, 0, 0)[:3]
    seqs, groups = x.shape[0], x.shape[1]
    channels, kernel = weight.shape
    if groups * sum(segments) != channels or sum(segments) > x.shape[2]:
        raise ValueError(f"x {tuple(x.shape)} with segments {segments} does not give {channels} channels")
    out = torch.empty((seqs, channels), dtype=x.dtype, device=x.device) if out is None else out
    _conv_decode_kernel[(seqs, triton.cdiv(channels, BLOCK_C))](
        x, weight, state, slots.contiguous(), out, seqs, channels,
        *x.stride(), *weight.stride(), *state.stride(), *out.stride(),
        GROUPS=groups, SEG0=seg0, SEG1=seg1, SEG2=seg2, KERNEL=kernel, K_PAD=triton.next_power_of_2(kernel),
        BLOCK_C=BLOCK_C, SEQS_PAD=max(16, triton.next_power_of_2(seqs)), COPY_ROWS=COPY_ROWS, num_warps=4,
    )
    return out


def triton_gdn_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                      a_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
                      out: torch.Tensor | None = None, tile: tuple[int, int] | None = None) -> torch.Tensor:
    """One token per sequence, any strides: q, k [seqs, key_heads, key_dim]; v [seqs, heads, value_dim]; b, a
    [seqs, heads] or [seqs, key_heads, heads // key_heads]; a_log, dt_bias [heads]; state [num_slots, heads,
    key_dim, value_dim] (any float dtype, float32 math), stepped in place at rows `slots` [seqs] (rows sharing a slot
    must be copies).
    Returns out [seqs, heads, value_dim] in v's dtype (written into `out` if given). `tile` is (value columns per
    program, warps), by default the batch's (see WIDE_FROM_SEQS); benchmarks/kernel_speed.py measures the choices."""
    seqs, key_heads, key_dim = k.shape
    tile = tile or (WIDE_TILE if seqs >= WIDE_FROM_SEQS else NARROW_TILE)
    heads, value_dim = v.shape[1], v.shape[2]
    group = heads // key_heads
    b, a = (t.unflatten(1, (key_heads, group)) if t.dim() == 2 else t for t in (b, a))
    out = torch.empty((seqs, heads, value_dim), dtype=v.dtype, device=v.device) if out is None else out
    block_v, warps = min(tile[0], triton.next_power_of_2(value_dim)), tile[1]
    _gdn_decode_kernel[(seqs, heads, triton.cdiv(value_dim, block_v))](
        q, k, v, b, a, a_log.contiguous(), dt_bias.contiguous(), state, slots.contiguous(), out, seqs, key_dim ** -0.5,
        *q.stride(), *k.stride(), *v.stride(), *b.stride(), *a.stride(), *state.stride(), *out.stride(),
        GROUP=group, KEY_DIM=key_dim, VALUE_DIM=value_dim, K_PAD=triton.next_power_of_2(key_dim), BLOCK_V=block_v,
        SEQS_PAD=max(16, triton.next_power_of_2(seqs)), COPY_ROWS=COPY_ROWS, num_warps=warps,
    )
    return out
