"""GDN's short causal depthwise conv (+ SiLU) with a per-sequence state of the last kernel - 1 inputs.

State layout per slot: [channels, kernel - 1], oldest input first. A prefill chunk continues from the saved
state (zeros for a new sequence); a decode token slides the window by one. A decode step on CUDA in half precision
runs engine/ops/triton_gdn.py's kernel, which slides each slot in place (no gather or scatter of the states) and reads
GDN's grouped projection output directly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.ops import HALF
from engine.ops.fused import fused
from engine.step_plan import StepContext

try:
    from engine.ops.triton_conv_prefill import triton_conv_prefill
    from engine.ops.triton_gdn import triton_conv_decode
except ImportError:  # no Triton (CPU-only installs): the PyTorch path serves every device
    triton_conv_decode = triton_conv_prefill = None



def conv_prefill(
    x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [tokens, channels], weight [channels, kernel], state [channels, kernel - 1] or None (a new sequence).

    Returns (silu(conv(x)) [tokens, channels], the new state [channels, kernel - 1]) in x's dtype.
    """
    channels, kernel = weight.shape
    weight = weight.float()
    history = state.float() if state is not None else x.new_zeros(channels, kernel - 1, dtype=torch.float32)
    window = torch.cat((history, x.t().float()), dim=-1)  # [channels, kernel - 1 + tokens]
    tokens = x.shape[0]
    # `kernel` shifted multiply-adds in float32 rather than F.conv1d: the same math on every device (cuDNN would take
    # float32 through TF32), and memory stays at one [channels, tokens] buffer.
    out = window[:, :tokens] * weight[:, :1]
    for tap in range(1, kernel):
        out = out + window[:, tap:tap + tokens] * weight[:, tap:tap + 1]
    return F.silu(out).t().to(x.dtype), window[:, window.shape[-1] - (kernel - 1):]


@fused
def conv_decode(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: x [seqs, channels], state [seqs, channels, kernel - 1].

    Returns (silu(conv) [seqs, channels], the new states [seqs, channels, kernel - 1]).
    """
    window = torch.cat((state.float(), x.float().unsqueeze(-1)), dim=-1)  # [seqs, channels, kernel]
    out = (window * weight.float().unsqueeze(0)).sum(dim=-1)
    return F.silu(out).to(x.dtype), window[:, :, 1:]


def ungroup(x: torch.Tensor, segments: tuple[int, ...]) -> torch.Tensor:
    """[tokens, groups, width] -> [tokens, channels]: each segment's columns of every group in turn (a copy)."""
    starts = [sum(segments[:i]) for i in range(len(segments))]
    return torch.cat([x[..., start:start + width].flatten(1) for start, width in zip(starts, segments, strict=True)],
                     dim=-1)


def conv_forward(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, ctx: StepContext,
                 segments: tuple[int, ...] | None = None) -> torch.Tensor:
    """The whole step's tokens x [tokens, channels] (flat, batch order); reads and writes each sequence's slot.
    With `segments`, x is [tokens, groups, width] and the channels are each segment's columns of every group in turn
    (GDN's q, k, v of each key head, read from the projection output as it comes).

    Decode tokens (one new token on top of a cache) go through one batched window slide; prefill chunks one by one,
    or all at once on CUDA in half precision. Returns [tokens, channels] in x's dtype.
    """
    if triton_conv_decode is not None and x.is_cuda and x.dtype in HALF:
        if ctx.decode is not None:
            return triton_conv_decode(x, weight, conv_state, ctx.decode.slots, segments)
        out = x.new_empty((x.shape[0], weight.shape[0]))
        if ctx.decode_rows is not None:  # distinct slots, none of them a prefill span's: any order
            rows, slots = ctx.decode_rows
            out[rows] = triton_conv_decode(x[rows], weight, conv_state, slots, segments)
        return triton_conv_prefill(x, weight, conv_state, ctx.prefill_spans, segments, out=out)
    if segments is not None:
        x = ungroup(x, segments)
    if ctx.decode is not None:  # every row decodes, in slot order of ctx.decode: no row gather or scatter
        out, states = conv_decode(x, weight, conv_state[ctx.decode.slots])
        conv_state[ctx.decode.slots] = states.to(conv_state.dtype)
        return out
    out = torch.empty_like(x)
    if ctx.decode_rows is not None:
        rows, slots = ctx.decode_rows
        out[rows], states = conv_decode(x[rows], weight, conv_state[slots])
        conv_state[slots] = states.to(conv_state.dtype)
    for start, end, slot, continues in ctx.prefill_spans:
        initial = conv_state[slot] if continues else None
        out[start:end], conv_state[slot] = conv_prefill(x[start:end], weight, initial)
    return out
