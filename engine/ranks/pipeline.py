"""Stage-to-stage transport of activations with torch.distributed (gloo on CPU, NCCL on GPUs).

NCCL needs one GPU per rank: ranks that share a GPU (a rig emulated on one large card) use gloo, with activations
staged through host memory.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.errors import EngineError

RENDEZVOUS_S = 600.0
# How long a rank waits for its peer's activations before it reports the pipeline broken. On a GPU a rank's first
# steps compile kernels while the next rank waits (Triton's JIT, fla's autotuning; on the H200 rig a compile inside a
# step outlasted 30 s). A dead peer is still seen at once: the driver watches every rank's process.
STEP_TIMEOUT_S = {"cpu": 30.0, "cuda": 300.0}
PIPELINE_TIMEOUT_ENV = "SEAM_PIPELINE_TIMEOUT_S"  # overrides STEP_TIMEOUT_S (fault tests use seconds)
_staged = False  # set by init_group: activations cross through host memory (gloo between ranks of one GPU)
_transfer_timeout: timedelta | None = None  # set by init_group for gloo: each transfer waits this long, no longer


class TransportError(EngineError):
    """A transfer between ranks failed (the peer timed out, stalled or went away). After one, the process group is
    unusable: gloo closes the pair, and every later transfer fails ('pair closure') until the ranks are replaced."""


def seconds_from_env(name: str, default: float) -> float:
    """A positive number of seconds from the environment variable `name`, else `default`."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise EngineError(f"{name} must be a positive number of seconds (got {raw!r})")
    return value


def init_group(rank: int, world: int, init_method: str, device: torch.device, timeout_s: float | None = None,
               shared_device: bool = False) -> None:
    """Join the ranks' process group; a silent peer surfaces as an error after `timeout_s` (default: STEP_TIMEOUT_S
    for the device type, or PIPELINE_TIMEOUT_ENV), not a hang."""
    global _staged, _transfer_timeout
    if timeout_s is None:
        timeout_s = seconds_from_env(PIPELINE_TIMEOUT_ENV, STEP_TIMEOUT_S[device.type])
    _staged = device.type == "cuda" and shared_device
    backend = "nccl" if device.type == "cuda" and not shared_device else "gloo"
    # The rendezvous waits longer than a step may: rank processes on one card create their CUDA contexts one after
    # another (seen on an H200: 3 ranks took over 30 s to join). A dead peer still surfaces after timeout_s.
    host, port = init_method.removeprefix("tcp://").rsplit(":", 1)
    store = dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=timedelta(seconds=RENDEZVOUS_S))
    # gloo also times its own connecting of every pair with the group's timeout: a transfer timeout of seconds there
    # failed the start-up of ranks on a loaded CPU. So its group gets the rendezvous's, and each transfer its own.
    _transfer_timeout = timedelta(seconds=timeout_s) if backend == "gloo" else None
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=RENDEZVOUS_S if backend == "gloo" else timeout_s))


def send_hidden(hidden: torch.Tensor, to_rank: int) -> None:
    tensor = hidden.cpu() if _staged else hidden.contiguous()
    try:
        if _transfer_timeout is None:
            dist.send(tensor, dst=to_rank)
        else:
            dist.isend(tensor, dst=to_rank).wait(timeout=_transfer_timeout)
    except RuntimeError as error:  # gloo and NCCL report timeouts and lost peers as RuntimeError (DistBackendError)
        raise TransportError(f"sending activations to rank {to_rank} failed: {error}") from error


def recv_hidden(tokens: int, hidden_size: int, dtype: torch.dtype, device: torch.device,
                from_rank: int) -> torch.Tensor:
    buffer = torch.empty((tokens, hidden_size), dtype=dtype, device="cpu" if _staged else device)
    try:
        if _transfer_timeout is None:
            dist.recv(buffer, src=from_rank)
        else:
            dist.irecv(buffer, src=from_rank).wait(timeout=_transfer_timeout)
    except RuntimeError as error:
        raise TransportError(f"receiving activations from rank {from_rank} failed: {error}") from error
    return buffer.to(device)


def close_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
