"""Stage-to-stage transport of activations with torch.distributed (gloo on CPU, NCCL on GPUs)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


def init_group(rank: int, world: int, init_method: str, device: torch.device, timeout_s: float = 30.0) -> None:
    """Join the ranks' process group; a dead peer surfaces as an error after `timeout_s`, not a hang."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def send_hidden(hidden: torch.Tensor, to_rank: int) -> None:
    dist.send(hidden.contiguous(), dst=to_rank)


def recv_hidden(tokens: int, hidden_size: int, dtype: torch.dtype, device: torch.device,
                from_rank: int) -> torch.Tensor:
    buffer = torch.empty((tokens, hidden_size), dtype=dtype, device=device)
    dist.recv(buffer, src=from_rank)
    return buffer


def close_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
