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


@dataclass(frozen=True)
class RungImage:
    """One rank's weights at one ladder rung, packed in the order the rank binds them: one contiguous copy."""

    buffer: torch.Tensor
    names: tuple[str, ...]  # parameter names in packing order (each at the running offset)
    crc32: int


class HostImage:
    def __init__(self, buffer: torch.Tensor, entries: dict[str, ImageEntry]):
        self.buffer, self.entries = buffer, entries
        self.rungs: dict[tuple[tuple[int, ...], int], RungImage] = {}

    @classmethod
    def build(cls, folder: str | Path, pin: bool = False, rungs: list[tuple[int, ...]] | None = None) -> HostImage:
        """Load the whole model once on the host and pack its parameters (by model name) into one buffer;
        with a ladder, also one contiguous image per (rung, rank)."""
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
        image = cls(buffer, entries)
        for cut in rungs or []:
            for rank in range(len(cut)):
                start = sum(cut[:rank])
                image.rungs[(tuple(cut), rank)] = image._pack(model.config, start, start + cut[rank], pin)
        return image

    def _pack(self, config, start: int, stop: int, pin: bool) -> RungImage:
        names = tuple(name for name, _ in rung_parameters(config, start, stop))
        total = sum(self.entry(source_name(config, name)).nbytes for name in names)
        buffer = torch.empty(total, dtype=torch.uint8)
        offset = 0
        for name in names:
            entry = self.entry(source_name(config, name))
            buffer[offset:offset + entry.nbytes] = self.buffer[entry.offset:entry.offset + entry.nbytes]
            offset += entry.nbytes
        buffer.share_memory_()
        if pin and torch.cuda.is_available():
            buffer = buffer.pin_memory()
        return RungImage(buffer, names, zlib.crc32(buffer.numpy()))

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


def source_name(config, name: str) -> str:
    """The image tensor a parameter is filled from: a tied lm_head is the embedding matrix."""
    return "embed_tokens.weight" if name == "lm_head.weight" and config.tie_word_embeddings else name


def rung_parameters(config, start: int, stop: int) -> list[tuple[str, torch.nn.Parameter]]:
    """A range's parameters in binding order (a tied matrix once), built on the meta device: no memory."""
    from engine.loader import build_model

    model = build_model(config, start, stop, device="meta")
    return list(model.named_parameters())
