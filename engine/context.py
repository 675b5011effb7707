"""Per-step metadata: one small object the runner builds and every layer reads.

A step processes a flat run of tokens from several sequences: each contributes `query_lens[i]`
new tokens (a prefill chunk, or 1 when decoding) on top of `cached_lens[i]` tokens already held in
its KV blocks and state slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass
class StepContext:
    query_lens: list[int]  # new tokens per sequence this step, in batch order
    cached_lens: list[int]  # tokens already cached per sequence before this step
    state_slots: list[int]  # recurrent/conv state slot per sequence
    block_tables: list[list[int]]  # KV block ids per sequence, covering cached + new tokens
    block_size: int
    positions: torch.Tensor  # [total new tokens] absolute positions, int64

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    def token_offsets(self) -> list[int]:
        """Start of each sequence's tokens in the flat batch (length num_seqs + 1)."""
        offsets = [0]
        for length in self.query_lens:
            offsets.append(offsets[-1] + length)
        return offsets

    def last_token_indices(self) -> torch.Tensor:
        """Flat index of each sequence's last new token: where its next-token logits come from."""
        offsets = self.token_offsets()
        return torch.tensor([end - 1 for end in offsets[1:]], dtype=torch.long, device=self.positions.device)

    @cached_property
    def decoding(self) -> list[int]:
        """Sequences adding one token on top of a cache: their recurrent layers take one batched step."""
        return [i for i in range(self.num_seqs) if self.query_lens[i] == 1 and self.cached_lens[i] > 0]

    @cached_property
    def decode_rows(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(flat token rows, state slots) of the decoding sequences, built once per step; None if there are none."""
        if not self.decoding:
            return None
        offsets, device = self.token_offsets(), self.positions.device
        rows = torch.tensor([offsets[i] for i in self.decoding], dtype=torch.long, device=device)
        slots = torch.tensor([self.state_slots[i] for i in self.decoding], dtype=torch.long, device=device)
        return rows, slots

    @cached_property
    def prefill_spans(self) -> list[tuple[int, int, int, bool]]:
        """(start, end, slot, continues_cache) of every other sequence with tokens this step."""
        offsets, decoded = self.token_offsets(), set(self.decoding)
        return [(offsets[i], offsets[i + 1], self.state_slots[i], self.cached_lens[i] > 0)
                for i in range(self.num_seqs) if i not in decoded and offsets[i] != offsets[i + 1]]

    @classmethod
    def for_prefill(cls, lengths: list[int], state_slots: list[int], block_tables: list[list[int]],
                    block_size: int, device: torch.device | str = "cpu") -> StepContext:
        """A step that processes whole prompts from an empty cache."""
        positions = torch.cat([torch.arange(n, dtype=torch.long) for n in lengths]).to(device)
        return cls(list(lengths), [0] * len(lengths), list(state_slots), block_tables, block_size, positions)
