"""One Mamba2 mixer, as Falcon-H1 and Granite-4.0-H build it (transformers' Mamba2 layout): not an adapter.

in_proj emits the z gate, the conv input (x, B, C) and dt; the depthwise conv runs over x, B and C. A sequence
keeps the conv window, conv_channels x (kernel - 1), and the SSM state, heads x head_dim x d_state.
"""

from __future__ import annotations

from typing import NamedTuple

from solvers.census.layers import Linear


class Mamba2Mixer(NamedTuple):
    params: int
    linears: list[Linear]
    conv_state_elements: int
    recurrent_state_elements: int


def mamba2_mixer(
    *, hidden: int, inner: int, heads: int, head_dim: int, groups: int, d_state: int, kernel: int,
    in_bias: bool, conv_bias: bool, out_bias: bool, gated_norm: bool, prefix: str = "mamba",
) -> Mamba2Mixer:
    """`inner` is the mixer's width (heads x head_dim); `gated_norm`: the gated RMSNorm over it is present."""
    conv_channels = inner + 2 * groups * d_state
    in_width = inner + conv_channels + heads  # z gate, conv input, dt
    params = (
        hidden * in_width + in_bias * in_width
        + conv_channels * kernel + conv_bias * conv_channels
        + 3 * heads  # dt_bias, A_log, D
        + gated_norm * inner
        + inner * hidden + out_bias * hidden
    )
    linears = [Linear(f"{prefix}.in_proj", in_width, hidden), Linear(f"{prefix}.out_proj", hidden, inner)]
    return Mamba2Mixer(params, linears, conv_channels * (kernel - 1), heads * head_dim * d_state)
