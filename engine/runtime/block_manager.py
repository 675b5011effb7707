"""Who owns which KV block and which state slot: the scheduler's accounting, apart from the tensors.

Every rank of a pipeline holds its own KV tensors for its own layers, but all ranks use the same
block ids and slot ids, so one manager (in the driver) serves the whole pipeline.
"""

from __future__ import annotations

from engine.errors import EngineError


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, tracks_kv: bool = True):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.tracks_kv = tracks_kv  # False when no layer's cache grows with tokens
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_tokens(self) -> int:
        return (self.num_blocks - len(self._free)) * self.block_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size) if self.tracks_kv else 0

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise EngineError(f"KV pool has {len(self._free)} free blocks; {count} were asked for")
        return [self._free.pop() for _ in range(count)]

    def release(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


class SlotManager:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def used_slots(self) -> int:
        return self.num_slots - len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise EngineError(f"all {self.num_slots} state slots are in use")
        return self._free.pop()

    def release(self, slot: int) -> None:
        self._free.append(slot)
