"""The address range a rank's slab lives in (engine/memory/slab.py): reserved once, backed only where it is used.

On CUDA the range is reserved at the rank's budget through the driver's virtual memory management and device memory
is mapped granule by granule (2 MiB on Hopper) for its used prefix: growing maps granules at the end, shrinking
unmaps them, and the bytes below never move. torch's caching allocator never sees the range, so it has no chunks to
keep partly used. On the CPU the range is anonymous memory reserved without being committed, and trimming gives the
pages past the end back to the kernel.
"""

from __future__ import annotations

import mmap

import torch

from engine.errors import EngineError

_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value; Python names it from 3.13


def round_up(nbytes: int, unit: int) -> int:
    return -(-nbytes // unit) * unit


def _driver():
    """NVIDIA's Python bindings of the driver API (cuda-python's cuda-bindings: the `gpu` extra)."""
    try:
        from cuda.bindings import driver
    except ImportError as error:
        raise EngineError("a slab on CUDA needs NVIDIA's driver bindings: pip install 'cuda-bindings' (the `gpu` "
                          f"extra), matching the driver's CUDA major version ({error})") from error
    return driver


class CudaAddressRange:
    """`capacity` bytes of device address space, mapped granule by granule for the prefix in use."""

    def __init__(self, device: torch.device, capacity: int):
        self.device, self.cuda = device, _driver()
        self.handles: list = []  # one physical granule each (CUmemGenericAllocationHandle), in address order
        self.capacity = 0
        torch.cuda.synchronize(device)  # the driver calls below need the device's primary context current
        cuda = self.cuda
        self.prop = cuda.CUmemAllocationProp()
        self.prop.type = cuda.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.location.type = cuda.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self.prop.location.id = device.index or 0
        self.access = cuda.CUmemAccessDesc()
        self.access.location = self.prop.location
        self.access.flags = cuda.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.granule = int(self._check("cuMemGetAllocationGranularity", self.prop,
                                       cuda.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
        self.capacity = round_up(capacity, self.granule)
        self.address = int(self._check("cuMemAddressReserve", self.capacity, 0, 0, 0))
        self.ensure(self.granule)  # torch reads the device of the first byte when it wraps the range
        self.base = torch.as_tensor(_CudaArray(self.address, self.capacity), device=device)

    @property
    def mapped_bytes(self) -> int:
        return len(self.handles) * self.granule

    def ensure(self, nbytes: int) -> None:
        """Map granules until the first `nbytes` are backed (the range never moves)."""
        if nbytes > self.capacity:
            raise EngineError(f"the slab needs {nbytes} B but its range holds {self.capacity} B (the rank's budget)")
        start = self.mapped_bytes
        while self.mapped_bytes < nbytes:
            handle = self._check("cuMemCreate", self.granule, self.prop, 0)
            self._check("cuMemMap", self.address + self.mapped_bytes, self.granule, 0, handle, 0)
            self.handles.append(handle)
        if self.mapped_bytes > start:
            self._check("cuMemSetAccess", self.address + start, self.mapped_bytes - start, [self.access], 1)

    def trim(self, nbytes: int) -> None:
        """Unmap the granules past the first `nbytes` (at least one stays), once the device is done with them."""
        keep = max(1, round_up(nbytes, self.granule) // self.granule)
        if len(self.handles) <= keep:
            return
        torch.cuda.synchronize(self.device)
        while len(self.handles) > keep:
            handle = self.handles.pop()
            self._check("cuMemUnmap", self.address + self.mapped_bytes, self.granule)
            self._check("cuMemRelease", handle)

    def _check(self, name: str, *args):
        """Call the driver; its value (None for a call that returns only a status), or an EngineError naming the
        call and CUDA's error."""
        status, *values = getattr(self.cuda, name)(*args)
        if status != self.cuda.CUresult.CUDA_SUCCESS:
            _, error_name = self.cuda.cuGetErrorName(status)
            raise EngineError(f"{name} failed with {error_name.decode() if error_name else status} on {self.device} "
                              f"(slab: {self.mapped_bytes} B mapped of {self.capacity} B)")
        return values[0] if values else None


class _CudaArray:
    """The reserved range as one byte array torch can wrap without copying."""

    def __init__(self, address: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                         "strides": None, "version": 2}


class HostAddressRange:
    """The CPU's range: anonymous memory reserved without committing it, the pages past the prefix in use given
    back (the budget itself is enforced in the rank's accounting)."""

    def __init__(self, device: torch.device, capacity: int):
        self.granule = mmap.PAGESIZE
        self.capacity = round_up(max(1, capacity), self.granule)
        self.pages = mmap.mmap(-1, self.capacity, flags=mmap.MAP_PRIVATE | _MAP_NORESERVE)
        self.base = torch.frombuffer(self.pages, dtype=torch.uint8)
        self.used = 0

    @property
    def mapped_bytes(self) -> int:
        return self.used

    def ensure(self, nbytes: int) -> None:
        if nbytes > self.capacity:
            raise EngineError(f"the slab needs {nbytes} B but its range holds {self.capacity} B (the rank's budget)")
        self.used = max(self.used, round_up(nbytes, self.granule))

    def trim(self, nbytes: int) -> None:
        keep = round_up(nbytes, self.granule)
        if self.used > keep:
            self.pages.madvise(mmap.MADV_DONTNEED, keep, self.used - keep)
            self.used = keep


def address_range(device: torch.device, capacity: int) -> CudaAddressRange | HostAddressRange:
    return CudaAddressRange(device, capacity) if device.type == "cuda" else HostAddressRange(device, capacity)
