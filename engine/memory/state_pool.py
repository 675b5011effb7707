"""Recurrent-state tensors of one rank: conv + recurrent state per slot for its linear-attention layers.

One slot per concurrent sequence (max_num_seqs): a fixed residency, never a per-token cost.
"""

from __future__ import annotations

from math import prod

import torch

from engine.config import ModelConfig
from engine.layers.caches import conv_state_shape, pool_tensor, recurrent_state_shape
from solvers.census import LayerKind


class StatePool:
    def __init__(self, config: ModelConfig, layers: range, num_slots: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", storage: torch.Tensor | None = None):
        self.num_slots = num_slots
        self.linear_layers = [i for i in layers if config.layer_kind(i) == LayerKind.LINEAR_ATTENTION]
        recurrent_shape, conv_shape = recurrent_state_shape(config, num_slots), conv_state_shape(config, num_slots)
        recurrent_size, conv_size, layers_held = prod(recurrent_shape), prod(conv_shape), len(self.linear_layers)
        # One allocation for every layer's states, like the KV pool's: a rebuild then frees one block and allocates
        # one, instead of two tensors a layer scattered through the allocator's pages. The recurrent states come
        # first, each a whole number of key x value head blocks, so each starts aligned; the small conv states follow.
        self._buffer = pool_tensor((layers_held * (recurrent_size + conv_size),), dtype, device, storage)
        conv_start = layers_held * recurrent_size
        self._states = {
            index: (self._buffer[conv_start + i * conv_size:conv_start + (i + 1) * conv_size].view(conv_shape),
                    self._buffer[i * recurrent_size:(i + 1) * recurrent_size].view(recurrent_shape))
            for i, index in enumerate(self.linear_layers)
        }

    @property
    def bytes(self) -> int:
        return self._buffer.numel() * self._buffer.element_size()

    def state(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._states[layer_index]
