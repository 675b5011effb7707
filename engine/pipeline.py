"""Stage-to-stage transport of activations with torch.distributed (gloo on CPU, NCCL on GPUs).

NCCL needs one GPU per rank: ranks that share a GPU (a rig emulated on one large card) use gloo, with activations
staged through host memory.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

RENDEZVOUS_S = 600.0
_staged = False  # set by init_group: activations cross through host memory (gloo between ranks of one GPU)


def init_group(rank: int, world: int, init_method: str, device: torch.device, timeout_s: float = 30.0,
               shared_device: bool = False) -> None:
    """Join the ranks' process group; a dead peer surfaces as an error after `timeout_s`, not a hang."""
    global _staged
    _staged = device.type == "cuda" and shared_device
    backend = "nccl" if device.type == "cuda" and not shared_device else "gloo"
    # The rendezvous waits longer than a step may: rank processes on one card create their CUDA contexts one after
    # another (seen on an H200: 3 ranks took over 30 s to join). A dead peer still surfaces after timeout_s.
    host, port = init_method.removeprefix("tcp://").rsplit(":", 1)
    store = dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=timedelta(seconds=RENDEZVOUS_S))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def send_hidden(hidden: torch.Tensor, to_rank: int) -> None:
    dist.send(hidden.cpu() if _staged else hidden.contiguous(), dst=to_rank)


def recv_hidden(tokens: int, hidden_size: int, dtype: torch.dtype, device: torch.device,
                from_rank: int) -> torch.Tensor:
    buffer = torch.empty((tokens, hidden_size), dtype=dtype, device="cpu" if _staged else device)
    dist.recv(buffer, src=from_rank)
    return buffer.to(device)


def close_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
