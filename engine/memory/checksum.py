"""A checksum computed where the bytes are: a rung's image on the host, the arena it arrived in on the device.

CRC-32 runs on the host only: checking a 5 GB arena that way meant copying it back and 6 s of zlib on the H200 rig,
nine times the copy itself. This one is a position-weighted sum of 32-bit words, modulo 2**64, in chunks; integer
addition modulo 2**64 does not depend on the order of the sums, so the host and the device agree bit for bit. A
flipped bit changes it (a weight below 2**23 times a power of two below 2**32 is never 0 mod 2**64), and so does a
swap of two words of a chunk (their weights differ) or of two whole chunks (the chunk weight).
"""

from __future__ import annotations

import torch

WORDS_PER_CHUNK = 1 << 22  # 16 MiB of words: the int64 temporaries are 32 MiB, a little of a rank's workspace
_MASK = (1 << 64) - 1


def arrival_checksum(buffer: torch.Tensor) -> int:
    """Checksum of a flat uint8 buffer on any device; one host synchronisation, at the end."""
    if buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise ValueError(f"arrival_checksum needs a flat uint8 buffer (got {buffer.dtype}, {buffer.dim()} dims)")
    words = buffer.numel() // 4
    body = buffer[:words * 4].view(torch.int32)
    weights = torch.arange(1, min(words, WORDS_PER_CHUNK) + 1, dtype=torch.int64, device=buffer.device)
    total = torch.zeros((), dtype=torch.int64, device=buffer.device)
    for index, start in enumerate(range(0, words, WORDS_PER_CHUNK)):
        chunk = body[start:start + WORDS_PER_CHUNK].to(torch.int64)
        total += (chunk * weights[:chunk.numel()]).sum() * (index + 1) + chunk.sum()
    total += buffer[words * 4:].to(torch.int64).sum()  # the last 0-3 bytes
    return int(total) & _MASK
