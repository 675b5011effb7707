"""The host image: every weight of the checkpoint in one contiguous host buffer, with a checksum each.

Ranks fill the layers they gain from it (one copy, no disk read, no re-read of layers that stay)
and verify each tensor's checksum on arrival, so a corrupted transfer is caught before it serves.
The buffer lives in shared memory so every rank process reads the same image. The whole image is not pinned; a
ladder's rung images are, each by the rank that copies from it, in place (engine.arena).
"""

from __future__ import annotations

import math
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.errors import EngineLoadError
from engine.loader import build_model, load_model
from engine.memory.checksum import arrival_checksum


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
    checksum: int  # engine.checksum.arrival_checksum: the arena is checked on the device, not copied back


class HostImage:
    def __init__(self, buffer: torch.Tensor, entries: dict[str, ImageEntry]):
        self.buffer, self.entries = buffer, entries
        self.rungs: dict[tuple[tuple[int, ...], int], RungImage] = {}

    @classmethod
    def build(cls, folder: str | Path, rungs: list[tuple[int, ...]] | None = None) -> HostImage:
        """Load the whole model once on the host and pack its parameters (by model name) into one buffer;
        with a ladder, also one contiguous image per (rung, rank)."""
        model = load_model(folder)
        params = {name: p.detach() for name, p in model.named_parameters(remove_duplicate=False)}
        image = cls._allocate({name: (tuple(p.shape), p.dtype) for name, p in params.items()})
        for name, param in params.items():
            image.raw(name).copy_(param.contiguous().view(torch.uint8).reshape(-1))
        return image._finish(model.config, rungs)

    @classmethod
    def random(cls, config, seed: int = 0, rungs: list[tuple[int, ...]] | None = None) -> HostImage:
        """The image of a random checkpoint of `config`, made in place: no checkpoint on disk, no model in memory.

        For rigs emulated at full size (tens of GB): every tensor is filled from one seeded block of N(0, 0.02)
        values in its dtype (a quantized checkpoint's fp8 weights and fp32 scales in theirs, packed 4-bit words from
        the model dtype's bytes), the scale of transformers' initialisation, so activations stay finite.
        """
        names = {name: (tuple(p.shape), p.dtype) for name, p in
                 build_model(config, 0, config.num_layers, device="meta").named_parameters(remove_duplicate=False)}
        image = cls._allocate(names)
        values = torch.randn(1 << 24, generator=torch.Generator().manual_seed(seed)) * 0.02
        blocks = {}
        for name, (_, dtype) in names.items():
            dtype = dtype if dtype.is_floating_point else config.torch_dtype
            if dtype not in blocks:
                blocks[dtype] = values.to(dtype).view(torch.uint8)
            block, raw = blocks[dtype], image.raw(name)
            for start in range(0, raw.numel(), block.numel()):
                piece = raw[start:start + block.numel()]
                piece.copy_(block[:piece.numel()])
        return image._finish(config, rungs)

    @classmethod
    def _allocate(cls, tensors: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> HostImage:
        """One shared-memory buffer laid out for `tensors` (name -> shape, dtype); checksums filled by _finish."""
        entries, offset = {}, 0
        for name, (shape, dtype) in tensors.items():
            nbytes = math.prod(shape) * dtype.itemsize
            entries[name] = ImageEntry(offset, nbytes, shape, dtype, 0)
            offset += nbytes
        # Allocated in shared memory directly: sharing a filled buffer afterwards would copy it.
        buffer = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(offset))
        return cls(buffer, entries)

    def _finish(self, config, rungs: list[tuple[int, ...]] | None) -> HostImage:
        crcs = _crc32_all([self.raw(name) for name in self.entries])
        self.entries = {name: replace(entry, crc32=crc) for (name, entry), crc in zip(self.entries.items(), crcs,
                                                                                       strict=True)}
        for cut in rungs or []:
            for rank in range(len(cut)):
                start = sum(cut[:rank])
                self.rungs[(tuple(cut), rank)] = self._pack(config, start, start + cut[rank])
        return self

    def raw(self, name: str) -> torch.Tensor:
        entry = self.entry(name)
        return self.buffer[entry.offset:entry.offset + entry.nbytes]

    def _pack(self, config, start: int, stop: int) -> RungImage:
        names = tuple(name for name, _ in rung_parameters(config, start, stop))
        total = sum(self.entry(source_name(config, name)).nbytes for name in names)
        buffer = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(total))
        offset = 0
        for name in names:
            entry = self.entry(source_name(config, name))
            buffer[offset:offset + entry.nbytes] = self.raw(source_name(config, name))
            offset += entry.nbytes
        return RungImage(buffer, names, arrival_checksum(buffer))

    @property
    def bytes(self) -> int:
        return self.buffer.numel()

    def tensor(self, name: str) -> torch.Tensor:
        entry = self.entry(name)
        return self.raw(name).view(entry.dtype).reshape(entry.shape)

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


def _crc32_all(raws: list[torch.Tensor]) -> list[int]:
    """crc32 of many buffers on all cores (zlib releases the GIL on large inputs)."""
    with ThreadPoolExecutor() as pool:
        return list(pool.map(lambda raw: zlib.crc32(raw.numpy()), raws))


def source_name(config, name: str) -> str:
    """The image tensor a parameter is filled from: a tied lm_head is the embedding matrix."""
    return "embed_tokens.weight" if name == "lm_head.weight" and config.tie_word_embeddings else name


def rung_parameters(config, start: int, stop: int) -> list[tuple[str, torch.nn.Parameter]]:
    """A range's parameters in binding order (a tied matrix once), built on the meta device: no memory."""
    model = build_model(config, start, stop, device="meta")
    return list(model.named_parameters())
