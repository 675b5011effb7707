"""A rank's weights and pools packed end to end in one address range, in layer order, with nothing between them.

Order: embeddings, layers by index, final norm, head, then the KV pool and the state pool. A rebuild hands
`arrange` the parts of its new layout in that order: parts it keeps (their tensors already in the slab) move to their
places in the new packing, copied in place in an order that never overwrites bytes still to be read; fresh parts (on
the meta device) get offsets to be placed at (`allocator`), and so do the pools. The range is then trimmed to the
packing's end. After any number of moves a rank so holds what a fresh start of the same layout holds, to the mapping
granule: the holes torch's allocator left beside weights that stay, each keeping part of a 20 MiB chunk, cost the
reference rig's ranks 27-54 MB after a move (docs/benchmarks.md, "The rig's memory").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from engine.errors import EngineError
from engine.memory.address_range import address_range, round_up

ALIGN = 256  # every tensor starts on a 256-byte boundary: what cuBLAS and the Triton kernels' vector loads want
MOVE_CHUNK = 64 << 20  # bytes a copy moves at once; a move shorter than this goes through a staging buffer


def aligned(nbytes: int) -> int:
    return round_up(nbytes, ALIGN)


def held_tensors(module: nn.Module) -> list[torch.Tensor]:
    """Every tensor a module holds: its parameters and the merged tensors kept as plain attributes, each once."""
    seen: dict[int, torch.Tensor] = {}
    for submodule in module.modules():
        for value in [*vars(submodule).values(), *submodule._parameters.values()]:
            if isinstance(value, torch.Tensor):
                seen.setdefault(id(value), value)
    return list(seen.values())


def byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """[start, end) of the bytes a tensor reads in its storage."""
    size = tensor.element_size()
    start = tensor.storage_offset() * size
    if tensor.numel() == 0:
        return start, start
    return start, start + (1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))) * size


@dataclass
class _Part:
    name: str
    tensors: list[torch.Tensor]
    size: int
    source: int | None  # where a kept part starts now; None for a fresh one


@dataclass(frozen=True)
class Arrangement:
    offsets: dict[str, int]  # each part's start in the new packing
    tails: list[int]  # each pool's start
    end: int


class Slab:
    def __init__(self, device: torch.device, capacity: int):
        self.memory = address_range(device, capacity)
        self.move_chunk = MOVE_CHUNK

    @property
    def mapped_bytes(self) -> int:
        return self.memory.mapped_bytes

    def block(self, offset: int, nbytes: int) -> torch.Tensor:
        return self.memory.base[offset:offset + nbytes]

    def allocator(self, offset: int) -> Callable[[int], torch.Tensor]:
        """Blocks one after another from `offset`, each aligned (how a fresh part is placed: materialize)."""
        cursor = offset

        def allocate(nbytes: int) -> torch.Tensor:
            nonlocal cursor
            block, cursor = self.block(cursor, nbytes), cursor + aligned(nbytes)
            return block

        return allocate

    def arrange(self, parts: list[tuple[str, nn.Module]], tails: list[int]) -> Arrangement:
        """Pack `parts` (in order) and then `tails` (bytes each); move the kept parts to their places now."""
        planned, claimed = [], set()
        for name, module in parts:  # a tensor two parts share (a tied head) belongs to the first
            tensors = [t for t in held_tensors(module) if id(t) not in claimed]
            claimed.update(id(t) for t in tensors)
            planned.append(self._part(name, tensors))
        offsets, cursor = {}, 0
        for part in planned:
            offsets[part.name], cursor = cursor, cursor + part.size
        tail_offsets = []
        for nbytes in tails:
            tail_offsets.append(cursor)
            cursor += aligned(nbytes)
        kept = [part for part in planned if part.source is not None]
        extent = max([cursor, *(part.source + part.size for part in kept)])
        self.memory.ensure(extent)
        self._move_all([part for part in kept if part.source != offsets[part.name]], offsets)
        return Arrangement(offsets, tail_offsets, cursor)

    def trim(self, end: int) -> None:
        self.memory.trim(end)

    def _part(self, name: str, tensors: list[torch.Tensor]) -> _Part:
        meta = [t for t in tensors if t.is_meta]
        if meta and len(meta) < len(tensors):
            raise EngineError(f"part {name} is partly placed: a part is kept whole or placed whole")
        if meta:  # fresh: one aligned block per storage, as materialize places them
            storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in meta}
            return _Part(name, tensors, sum(aligned(n) for n in storages.values()), None)
        base = self.memory.base.untyped_storage().data_ptr()
        if any(t.untyped_storage().data_ptr() != base for t in tensors):
            raise EngineError(f"part {name} holds a tensor outside the rank's slab")
        spans = [byte_span(t) for t in tensors]
        if not spans:
            return _Part(name, tensors, 0, None)
        start = min(s for s, _ in spans)
        return _Part(name, tensors, aligned(max(e for _, e in spans) - start), start)

    def _move_all(self, moves: list[_Part], offsets: dict[str, int]) -> None:
        """Move each part to its offset, taking first a part whose destination holds no other part still to move."""
        pending = list(moves)
        while pending:
            ready = next((part for part in pending
                          if not any(other is not part and _overlap(offsets[part.name], part.size, other.source,
                                                                    other.size) for other in pending)), None)
            if ready is None:
                raise EngineError("the slab's moves wait on each other: " + ", ".join(p.name for p in pending))
            self._move(ready.source, offsets[ready.name], ready.size)
            self._rebind(ready.tensors, offsets[ready.name] - ready.source)
            pending.remove(ready)

    def _move(self, source: int, target: int, nbytes: int) -> None:
        """memmove within the slab: chunks copied in the order that reads every byte before it is overwritten."""
        delta, step = target - source, self.move_chunk
        starts = list(range(0, nbytes, step))
        if delta > 0:
            starts.reverse()
        staging = torch.empty(min(step, nbytes), dtype=torch.uint8, device=self.memory.base.device) \
            if abs(delta) < step else None  # a chunk would overlap its own destination
        for start in starts:
            count = min(step, nbytes - start)
            chunk = self.block(source + start, count)
            if staging is not None:
                chunk = staging[:count].copy_(chunk)
            self.block(target + start, count).copy_(chunk)

    def _rebind(self, tensors: list[torch.Tensor], delta: int) -> None:
        """Point each tensor at its bytes `delta` further on, same shape and strides."""
        storage = self.memory.base.untyped_storage()
        with torch.no_grad():
            for tensor in tensors:
                size = tensor.element_size()
                tensor.set_(storage, tensor.storage_offset() + delta // size, tensor.shape, tensor.stride())


def _overlap(start: int, size: int, other: int, other_size: int) -> bool:
    return start < other + other_size and other < start + size
