"""Rotary position embedding (neox half-rotation), full or partial, with default / linear / llama3 frequencies.

Only the leading `rotary_dim` channels of each head rotate (Qwen3-Next rotates a quarter); the rest pass through.
cos/sin are computed once per step for the step's positions and shared by every attention layer.
"""

from __future__ import annotations

import math

import torch

from engine.config import ModelConfig
from engine.ops.fused import fused


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    dim = config.rotary_dim
    # Always on the CPU, even while the model is being built on the meta device.
    steps = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float()
    inv_freq = 1.0 / (config.rope_theta ** (steps / dim))
    params = config.rope_params
    if config.rope_type == "linear":
        inv_freq = inv_freq / params["factor"]
    elif config.rope_type == "llama3":
        inv_freq = _llama3(inv_freq, params)
    return inv_freq


def _llama3(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Llama 3.1's band-wise scaling: long wavelengths slow down by `factor`, short ones keep, a smooth ramp between."""
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding:
    """Not an nn.Module: it holds no weights, only the frequencies, kept per device."""

    def __init__(self, config: ModelConfig):
        self.inv_freq = inverse_frequencies(config)
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [tokens, rotary_dim] for absolute `positions` [tokens]."""
        inv_freq = self._on_device.get(positions.device)
        if inv_freq is None:
            inv_freq = self._on_device[positions.device] = self.inv_freq.to(positions.device)
        freqs = positions[:, None].float() * inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


@fused
def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the leading cos.shape[-1] channels of x [tokens, heads, head_dim]."""
    rotary_dim = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    rotated = rotated * cos + _rotate_half(rotated) * sin
    return torch.cat((rotated, passed), dim=-1) if passed.shape[-1] else rotated
