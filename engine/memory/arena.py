"""A ladder rank's weights (docs/domain.md §9): a fixed device buffer, refilled from the rung's host image in one copy.

The rank's rung images are pinned in place once, when the ladder is armed (cudaHostRegister on the shared
buffer), so a switch is one DMA copy; the arrival is checked on the device (engine.checksum) without copying it
back. The arena is overwritten in place, so a failed check leaves no usable old weights: the driver restores by
switching back (another refill), which is what a ladder is for.
"""

from __future__ import annotations

import logging
import time

import torch

from engine.errors import EngineLoadError
from engine.memory.checksum import arrival_checksum
from engine.memory.device import pin_host_buffer
from engine.memory.host_image import HostImage, source_name
from engine.models import RangeCausalLM

log = logging.getLogger("seam.engine")


class Arena:
    def __init__(self, rank: int, config, image: HostImage, device: torch.device):
        self.rank, self.config, self.image, self.device = rank, config, image, device
        self.buffer: torch.Tensor | None = None
        self.reserve: torch.Tensor | None = None  # the deepest rung's state slots beyond this rung's
        self.copy_s: float | None = None  # the last refill's transfer alone: what the planner's switch cost prices
        self.pinned: set[tuple[int, ...]] = set()
        self.unpinned: dict[tuple[int, ...], str] = {}  # rung -> why CUDA would not pin its image

    def fill(self, model: RangeCausalLM, cut: tuple[int, ...], arena_bytes: int, state_reserve_bytes: int,
             corrupt: bool = False) -> float:
        """Copy the rung's image in, check it, bind `model`'s weights as views; the switch's seconds (copy +
        check). `corrupt` flips a byte after the copy (fault injection for tests)."""
        image = self.image.rungs[(cut, self.rank)]
        if self.device.type == "cuda":
            self._pin_rungs()
        if self.buffer is None or self.buffer.numel() != arena_bytes:
            self.buffer = torch.empty(arena_bytes, dtype=torch.uint8, device=self.device)
        used = image.buffer.numel()
        started = time.perf_counter()
        self.buffer[:used].copy_(image.buffer)
        if corrupt:
            self.buffer[0] ^= 0xFF
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.copy_s = time.perf_counter() - started
        arrived = arrival_checksum(self.buffer[:used])
        switch_s = time.perf_counter() - started
        if arrived != image.checksum:
            raise EngineLoadError(f"checksum mismatch on arrival of rung {list(cut)} on rank {self.rank}: "
                                  f"image {image.checksum:016x}, arena {arrived:016x}")
        offset = 0
        for name in image.names:
            entry = self.image.entry(source_name(self.config, name))
            view = self.buffer[offset:offset + entry.nbytes].view(entry.dtype).reshape(entry.shape)
            module_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(module_name), attr, torch.nn.Parameter(view, requires_grad=False))
            offset += entry.nbytes
        model.tie_weights()
        self.reserve = None  # released before its successor is allocated, like the pools
        self.reserve = torch.empty(state_reserve_bytes, dtype=torch.uint8, device=self.device)
        return switch_s

    def release(self) -> None:
        self.buffer = self.reserve = None

    def _pin_rungs(self) -> None:
        """Pin this rank's rung images once. An image CUDA will not pin still works, at the pageable rate; the
        build's figures say which (`unpinned`)."""
        for (cut, rank), image in self.image.rungs.items():
            if rank == self.rank and cut not in self.pinned and cut not in self.unpinned:
                error = pin_host_buffer(image.buffer)
                if error is None:
                    self.pinned.add(cut)
                else:
                    self.unpinned[cut] = error
                    log.warning("rank %d: rung %s stays pageable (%s)", self.rank, list(cut), error)
