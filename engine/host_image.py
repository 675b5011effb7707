"""The host image: every weight of the checkpoint in one contiguous host buffer, with a checksum each.

Ranks fill the layers they gain from it (one copy, no disk read, no re-read of layers that stay)
and verify each tensor's checksum on arrival, so a corrupted transfer is caught before it serves.
The buffer lives in shared memory so every rank process reads the same image; on CUDA it is pinned.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import EngineLoadError
from engine.loader import load_model


@dataclass(frozen=True)
class ImageEntry:
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    crc32: int


class HostImage:
    def __init__(self, buffer: torch.Tensor, entries: dict[str, ImageEntry]):
        self.buffer, self.entries = buffer, entries

    @classmethod
    def build(cls, folder: str | Path, pin: bool = False) -> HostImage:
        """Load the whole model once on the host and pack its parameters (by model name) into one buffer."""
        model = load_model(folder)
        params = {name: p.detach() for name, p in model.named_parameters(remove_duplicate=False)}
        total = sum(p.numel() * p.element_size() for p in params.values())
        buffer = torch.empty(total, dtype=torch.uint8)
        entries, offset = {}, 0
        for name, param in params.items():
            raw = param.contiguous().view(torch.uint8).reshape(-1)
            buffer[offset:offset + raw.numel()] = raw
            entries[name] = ImageEntry(offset, raw.numel(), tuple(param.shape), param.dtype,
                                       zlib.crc32(raw.numpy()))
            offset += raw.numel()
        buffer.share_memory_()
        if pin and torch.cuda.is_available():
            buffer = buffer.pin_memory()
        return cls(buffer, entries)

    @property
    def bytes(self) -> int:
        return self.buffer.numel()

    def tensor(self, name: str) -> torch.Tensor:
        entry = self.entry(name)
        raw = self.buffer[entry.offset:entry.offset + entry.nbytes]
        return raw.view(entry.dtype).reshape(entry.shape)

    def entry(self, name: str) -> ImageEntry:
        if name not in self.entries:
            raise EngineLoadError(f"host image has no tensor {name}")
        return self.entries[name]

    def layer_bytes(self, layers: range) -> int:
        prefixes = tuple(f"layers.{i}." for i in layers)
        return sum(e.nbytes for name, e in self.entries.items() if name.startswith(prefixes))

    def verify(self, name: str, arrived: torch.Tensor) -> None:
        """Raise EngineLoadError when what arrived is not byte-for-byte what the image holds."""
        expected = self.entry(name).crc32
        got = zlib.crc32(arrived.detach().cpu().contiguous().view(torch.uint8).reshape(-1).numpy())
        if got != expected:
            raise EngineLoadError(f"checksum mismatch for {name} on arrival: image crc32 {expected:08x}, "
                                  f"arrived {got:08x}")
