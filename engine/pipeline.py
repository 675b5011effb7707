"""Stage-to-stage transport of activations with torch.distributed (gloo on CPU, NCCL on GPUs).

NCCL needs one GPU per rank: ranks that share a GPU (a rig emulated on one large card) use gloo, with activations
staged through host memory.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

RENDEZVOUS_S = 600.0
# How long a rank waits for its peer's activations before it reports the pipeline broken. On a GPU a rank's first
# steps compile kernels while the next rank waits (Triton's JIT, fla's autotuning; on the H200 rig a compile inside a
# step outlasted 30 s). A dead peer is still seen at once: the driver watches every rank's process.
STEP_TIMEOUT_S = {"cpu": 30.0, "cuda": 300.0}
_staged = False  # set by init_group: activations cross through host memory (gloo between ranks of one GPU)


def init_group(rank: int, world: int, init_method: str, device: torch.device, timeout_s: float | None = None,
               shared_device: bool = False) -> None:
    """Join the ranks' process group; a silent peer surfaces as an error after `timeout_s` (default: STEP_TIMEOUT_S
    for the device type), not a hang."""
    global _staged
    timeout_s = STEP_TIMEOUT_S[device.type] if timeout_s is None else timeout_s
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
