"""The paged KV pool of one rank: blocks of tokens for its full-attention layers only.

Its size comes from the planner (solvers.capacity), so what the engine allocates is what the
planner predicted, to the token. Blocks are handed out whole; a sequence owns a block table.
"""

from __future__ import annotations

import torch

from engine.caches import kv_cache_shape
from engine.config import ModelConfig
from engine.errors import EngineError


class KVPool:
    def __init__(self, config: ModelConfig, layers: range, pool_tokens: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        if pool_tokens % block_size:
            raise EngineError(f"KV pool of {pool_tokens} tokens is not a whole number of {block_size}-token blocks")
        self.block_size = block_size
        self.num_blocks = pool_tokens // block_size
        self.attention_layers = [i for i in layers if i in set(config.census.attention_layers)]
        shape = kv_cache_shape(config, self.num_blocks, block_size)
        self._caches = {
            index: (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for index in self.attention_layers
        }
        self._free = list(range(self.num_blocks - 1, -1, -1))  # pop() hands out low ids first

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_tokens(self) -> int:
        return (self.num_blocks - len(self._free)) * self.block_size

    @property
    def bytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self._caches.values())

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise EngineError(f"KV pool has {len(self._free)} free blocks; {count} were asked for")
        return [self._free.pop() for _ in range(count)]

    def release(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))

    def kv(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._caches[layer_index]
