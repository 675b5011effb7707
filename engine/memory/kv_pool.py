"""The paged KV tensors of one rank: blocks of tokens for its full-attention layers only.

Its size comes from the planner (solvers.capacity), so what the engine allocates is what the
planner predicted, to the token. Which block belongs to whom is the BlockManager's business.
"""

from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.errors import EngineError
from engine.layers.caches import kv_cache_shape, pool_tensor


class KVPool:
    def __init__(self, config: ModelConfig, layers: range, pool_tokens: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", storage: torch.Tensor | None = None):
        if pool_tokens % block_size:
            raise EngineError(f"KV pool of {pool_tokens} tokens is not a whole number of {block_size}-token blocks")
        self.block_size = block_size
        self.num_blocks = pool_tokens // block_size
        attention = set(config.census.attention_layers)
        self.attention_layers = [i for i in layers if i in attention]
        shape = kv_cache_shape(config, self.num_blocks, block_size)
        # One allocation for every layer's K and V: the CUDA allocator rounds each tensor up to 2 MiB, which per
        # layer cost the binding rank of the reference rig 10 MB (~1,000 tokens) on the H200.
        # `storage`: the bytes to build on (a block of the rank's slab, engine/memory/slab.py), else a tensor of its
        # own.
        self._buffer = pool_tensor((len(self.attention_layers), 2, *shape), dtype, device, storage)
        self._caches = {index: (self._buffer[i, 0], self._buffer[i, 1])
                        for i, index in enumerate(self.attention_layers)}

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def bytes(self) -> int:
        return self._buffer.numel() * self._buffer.element_size()

    def kv(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._caches[layer_index]
