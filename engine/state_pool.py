"""Recurrent-state tensors of one rank: conv + recurrent state per slot for its linear-attention layers.

One slot per concurrent sequence (max_num_seqs): a fixed residency, never a per-token cost.
"""

from __future__ import annotations

import torch

from engine.caches import conv_state_shape, recurrent_state_shape
from engine.config import ModelConfig
from solvers.census import LayerKind


class StatePool:
    def __init__(self, config: ModelConfig, layers: range, num_slots: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        self.num_slots = num_slots
        self.linear_layers = [i for i in layers if config.layer_kind(i) == LayerKind.LINEAR_ATTENTION]
        self._states = {
            index: (torch.zeros(conv_state_shape(config, num_slots), dtype=dtype, device=device),
                    torch.zeros(recurrent_state_shape(config, num_slots), dtype=dtype, device=device))
            for index in self.linear_layers
        }

    @property
    def bytes(self) -> int:
        return sum(c.numel() * c.element_size() + r.numel() * r.element_size() for c, r in self._states.values())

    def state(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._states[layer_index]
