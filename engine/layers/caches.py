"""What the model needs from memory: per-layer KV blocks (attention layers) and per-layer state slots (GDN layers).

The model only ever calls the two methods of `LayerCaches`, with *global* layer indices (layer 40 is layer 40 on
every rank). The real pools (engine/memory/kv_pool.py, engine/memory/state_pool.py) implement this; `InMemoryCaches` is
the
simple implementation tests use.

Tensor shapes and dtypes (the layers read and write them in place):
- kv(i) -> (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim], dtype = the KV dtype.
  A sequence's token at position p lives in block `block_tables[s][p // block_size]`, row `p % block_size`.
- state(i) -> (conv_state, recurrent_state):
  conv_state      [num_slots, conv_dim, kernel - 1]         conv_dim = 2 x key heads x key dim + value heads x value dim
  recurrent_state [num_slots, num_value_heads, key_head_dim, value_head_dim]
  dtype = the state dtype. float32 keeps the recurrence closest to the reference, whatever the weights' dtype.
A slot's contents are ignored when its sequence has no cached tokens (cached_lens == 0): a step that starts a
sequence writes the slot from zeros, so a freed slot never needs clearing.
"""

from __future__ import annotations

from math import prod
from typing import Protocol, runtime_checkable

import torch

from engine.config import ModelConfig
from solvers.census import LayerKind

# Cache dtypes by the names shapes and configs use (fp8 is storage only: the ops compute in wider types).
CACHE_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}


@runtime_checkable
class LayerCaches(Protocol):
    def kv(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k_cache, v_cache) of an attention layer."""
        ...

    def state(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv_state, recurrent_state) of a linear-attention layer."""
        ...


def kv_cache_shape(config: ModelConfig, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
    return (num_blocks, block_size, config.num_kv_heads, config.head_dim)


def conv_state_shape(config: ModelConfig, num_slots: int) -> tuple[int, int, int]:
    return (num_slots, config.conv_dim, config.linear_conv_kernel_dim - 1)


def recurrent_state_shape(config: ModelConfig, num_slots: int) -> tuple[int, int, int, int]:
    return (num_slots, config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim)


class InMemoryCaches:
    """Every layer of `layers` gets its own zeroed tensors: no budget, no accounting (tests, demos)."""

    def __init__(
        self, config: ModelConfig, num_blocks: int, block_size: int, num_slots: int, layers: range | None = None,
        device: torch.device | str = "cpu", kv_dtype: torch.dtype | None = None,
        state_dtype: torch.dtype = torch.float32,
    ):
        self.block_size = block_size
        self._kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._state: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        kv_dtype = kv_dtype or config.torch_dtype
        for index in layers if layers is not None else range(config.num_layers):
            kind = config.layer_kind(index)
            if kind == LayerKind.LINEAR_ATTENTION:
                self._state[index] = (
                    torch.zeros(conv_state_shape(config, num_slots), dtype=state_dtype, device=device),
                    torch.zeros(recurrent_state_shape(config, num_slots), dtype=state_dtype, device=device),
                )
            else:
                shape = kv_cache_shape(config, num_blocks, block_size)
                self._kv[index] = (
                    torch.zeros(shape, dtype=kv_dtype, device=device),
                    torch.zeros(shape, dtype=kv_dtype, device=device),
                )

    def kv(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._kv[layer_index]

    def state(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._state[layer_index]


def pool_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str,
                storage: torch.Tensor | None) -> torch.Tensor:
    """A pool's zeroed tensor: on `storage` (bytes, exactly as many as the pool needs) where given, else its own."""
    if storage is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = prod(shape) * dtype.itemsize
    if storage.dtype != torch.uint8 or storage.numel() != nbytes:
        raise ValueError(f"a pool of {nbytes} B cannot be built on {storage.numel()} {storage.dtype} elements")
    return storage.view(dtype).view(shape).zero_()
