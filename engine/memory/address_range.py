"""The address range a rank's slab lives in (engine/memory/slab.py): reserved once, backed only where it is used.

On CUDA the range is reserved at the rank's budget through the driver's virtual memory management and device memory
is mapped granule by granule (2 MiB on Hopper) for its used prefix: growing maps granules at the end, shrinking
unmaps them, and the bytes below never move. torch's caching allocator never sees the range, so it has no chunks to
keep partly used. On the CPU the range is anonymous memory reserved without being committed, and trimming gives the
pages past the end back to the kernel.
"""

from __future__ import annotations

import ctypes
import mmap

import torch

from engine.errors import EngineError

# cuda.h's values (stable since CUDA 10.2)
_PINNED, _LOCATION_DEVICE, _READ_WRITE, _GRANULARITY_MINIMUM = 1, 1, 3, 0
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value; Python names it from 3.13


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


def round_up(nbytes: int, unit: int) -> int:
    return -(-nbytes // unit) * unit


def _driver() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise EngineError(f"the CUDA driver library (libcuda.so.1) could not be loaded: {error}") from error


class CudaAddressRange:
    """`capacity` bytes of device address space, mapped granule by granule for the prefix in use."""

    def __init__(self, device: torch.device, capacity: int):
        self.device, self.cuda = device, _driver()
        self.handles: list[int] = []  # one physical granule each, in address order
        self.capacity = 0
        torch.cuda.synchronize(device)  # the driver calls below need the device's primary context current
        self.prop = _AllocationProp(type=_PINNED, location=_Location(_LOCATION_DEVICE, device.index or 0))
        self.access = _AccessDesc(location=self.prop.location, flags=_READ_WRITE)
        granule = ctypes.c_size_t()
        self._check("cuMemGetAllocationGranularity", ctypes.byref(granule), ctypes.byref(self.prop),
                    _GRANULARITY_MINIMUM)
        self.granule = granule.value
        self.capacity = round_up(capacity, self.granule)
        address = ctypes.c_uint64()
        self._check("cuMemAddressReserve", ctypes.byref(address), ctypes.c_size_t(self.capacity),
                    ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_uint64(0))
        self.address = address.value
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
            handle = ctypes.c_uint64()
            self._check("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(self.granule), ctypes.byref(self.prop),
                        ctypes.c_uint64(0))
            self._check("cuMemMap", ctypes.c_uint64(self.address + self.mapped_bytes), ctypes.c_size_t(self.granule),
                        ctypes.c_size_t(0), handle, ctypes.c_uint64(0))
            self.handles.append(handle.value)
        if self.mapped_bytes > start:
            self._check("cuMemSetAccess", ctypes.c_uint64(self.address + start),
                        ctypes.c_size_t(self.mapped_bytes - start), ctypes.byref(self.access), ctypes.c_size_t(1))

    def trim(self, nbytes: int) -> None:
        """Unmap the granules past the first `nbytes` (at least one stays), once the device is done with them."""
        keep = max(1, round_up(nbytes, self.granule) // self.granule)
        if len(self.handles) <= keep:
            return
        torch.cuda.synchronize(self.device)
        while len(self.handles) > keep:
            handle = self.handles.pop()
            self._check("cuMemUnmap", ctypes.c_uint64(self.address + self.mapped_bytes), ctypes.c_size_t(self.granule))
            self._check("cuMemRelease", ctypes.c_uint64(handle))

    def _check(self, name: str, *args) -> None:
        result = getattr(self.cuda, name)(*args)
        if result != 0:
            raise EngineError(f"{name} failed with CUDA error {result} on {self.device} "
                              f"(slab: {self.mapped_bytes} B mapped of {self.capacity} B)")


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
