"""Real device memory of one rank process on CUDA: torch's allocator and NVML, read without synchronising.

Several ranks may share one large GPU (a rig emulated on one card): each caps torch's allocator at its rig budget,
reports its own allocator figures and NVML's view of the card and of its own process, and can probe how much more
its capped allocator would really hand out (what the planner's slack predicts).
"""

from __future__ import annotations

import os
import time

import torch

READ_EVERY_S = 0.25  # telemetry runs at a few Hz: fresher figures would only cost NVML calls
ALLOCATOR_CONF = "PYTORCH_CUDA_ALLOC_CONF"
# One growing segment a stream instead of fixed 2 / 20 MiB segments, whose unused tails the rank held and never
# allocated (39 MB of it on the reference rig's binding rank on the H200). It still maps large allocations in 20 MiB
# chunks and gives back only whole ones: a hole beside a tensor that stays keeps part of a chunk.
EXPANDABLE = "expandable_segments:True"
FREE_BLOCKS_LISTED = 40  # the largest free blocks of a pool, for the record


def prefer_expandable_segments() -> str:
    """Expandable segments unless the operator configured the allocator: the settings to apply before CUDA starts.

    torch reads the variable when it is imported, which a rank process has done before it runs: the caller applies
    the settings itself (torch.cuda.memory._set_allocator_settings), the way torchtune does.
    """
    return os.environ.setdefault(ALLOCATOR_CONF, EXPANDABLE)


def cuda_memory(device: torch.device) -> dict:
    """What torch's allocator holds for this process, and what NVML says of the card and of this process."""
    figures = {"device_allocated_bytes": torch.cuda.memory_allocated(device),
               "device_reserved_bytes": torch.cuda.memory_reserved(device)}
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        figures.update(device_total_bytes=info.total, device_used_bytes=info.used, device_free_bytes=info.free)
        # This process's own share of the card (CUDA context + allocator), when NVML can see our pid.
        mine = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
        figures["process_used_bytes"] = mine[0] if mine else None
    except Exception as error:  # NVML missing or refused: say so rather than guess
        figures["nvml_error"] = str(error)
    return figures


def allocator_pools(device: torch.device) -> dict:
    """torch's allocator pool by pool, from its snapshot: the default pool (weights, pools, cuBLAS's workspace) apart
    from the private pools CUDA graphs were captured into (the planner's workspace), with the free blocks that sit in
    mapped pages (what the rank holds but no tensor uses: the allocator's slack)."""
    pools = {name: {"reserved": 0, "allocated": 0, "segments": 0, "expandable_segments": 0, "small_reserved": 0,
                   "free_blocks": []}
             for name in ("default", "graphs")}
    for segment in torch.cuda.memory_snapshot():
        if segment["device"] != (device.index or 0):
            continue
        pool = pools["default" if tuple(segment["segment_pool_id"]) == (0, 0) else "graphs"]
        pool["reserved"] += segment["total_size"]
        pool["allocated"] += segment["allocated_size"]
        pool["segments"] += 1
        pool["expandable_segments"] += int(bool(segment.get("is_expandable")))
        pool["small_reserved"] += segment["total_size"] if segment["segment_type"] == "small" else 0
        pool["free_blocks"] += [block["size"] for block in segment["blocks"] if block["state"] == "inactive"]
    for pool in pools.values():
        free = sorted(pool.pop("free_blocks"), reverse=True)
        pool.update(free_count=len(free), free_bytes=sum(free), largest_free_blocks=free[:FREE_BLOCKS_LISTED])
    return pools


def pin_host_buffer(buffer: torch.Tensor) -> str | None:
    """Page-lock a host buffer for this process (cudaHostRegister), shared memory included: copies from it then run
    at the link's DMA rate, not through a pageable staging buffer (about 6 GB/s a process on the H200 rig).
    None when pinned, else what CUDA said."""
    error = torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.numel() * buffer.element_size(), 0)
    return None if int(error) == 0 else f"cudaHostRegister failed: CUDA error {int(error)}"


def cap_cuda_memory(device: torch.device, memory_bytes: int) -> None:
    """Cap this process's allocator at its rig budget, so several ranks can share one large GPU."""
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, memory_bytes / total), device)


def reserve_blas_workspaces(device: torch.device) -> None:
    """Have cuBLAS make its workspaces now, before any weight arrives. torch keeps them (32 MiB each on the H200) for
    the life of the process; made lazily in the first forward, one landed between that step's activations and held
    a partly used 20 MiB allocator chunk for good once they were freed."""
    square = torch.ones(16, 16, dtype=torch.bfloat16, device=device)
    torch.nn.functional.linear(square, square)
    torch.nn.functional.linear(square, square, square[0])
    square.float() @ square.float()
    torch.cuda.synchronize(device)


class MemoryReader:
    """cuda_memory at most every READ_EVERY_S (None in between, and always None off CUDA)."""

    def __init__(self, device: torch.device):
        self.device, self.last = device, 0.0

    def read(self) -> dict | None:
        now = time.monotonic()
        if self.device.type != "cuda" or now - self.last < READ_EVERY_S:
            return None
        self.last = now
        return {**cuda_memory(self.device), "read_at": time.time()}


def probe_headroom(device: torch.device, chunk_bytes: int) -> dict:
    """Allocate chunks until the capped allocator refuses; report how many fitted, then free them all."""
    held = []
    try:
        while True:
            held.append(torch.empty(chunk_bytes, dtype=torch.uint8, device=device))
    except torch.OutOfMemoryError:
        pass
    figures = {"chunk_bytes": chunk_bytes, "chunks": len(held), "headroom_bytes": len(held) * chunk_bytes,
               **cuda_memory(device)}
    del held
    torch.cuda.empty_cache()
    return figures
