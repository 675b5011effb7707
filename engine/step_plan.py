"""Per-step metadata: one small object the runner builds and every layer reads.

A step processes a flat run of tokens from several sequences: each contributes `query_lens[i]`
new tokens (a prefill chunk, or 1 when decoding) on top of `cached_lens[i]` tokens already held in
its KV blocks and state slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain

import numpy as np
import torch


@dataclass
class DecodeBatch:
    """A step in which every sequence adds one token on top of its cache, as tensors only.

    Layers read these instead of the Python lists, so such a step makes no host round trip and can be captured in a
    CUDA graph (engine/graphs.py fills fixed buffers of this shape and replays).
    """

    slots: torch.Tensor  # [seqs] long: recurrent/conv state slot
    block_table: torch.Tensor  # [seqs, width] int32: KV blocks, padded with block 0 past each sequence's end
    context_lens: torch.Tensor  # [seqs] int32: cached tokens + this one
    slot_mapping: torch.Tensor  # [seqs] long: the KV row this token is written to

    @classmethod
    def build(cls, cached_lens: list[int], state_slots: list[int], block_tables: list[list[int]], block_size: int,
              device: torch.device | str, width: int | None = None) -> DecodeBatch:
        seqs = len(cached_lens)
        width = width or max(-(-(cached + 1) // block_size) for cached in cached_lens)
        rows = DecodeRows.empty(seqs, width)
        rows.fill(cached_lens, state_slots, block_tables, block_size)
        return cls(**{name: torch.from_numpy(value).to(device, non_blocking=True)
                      for name, value in rows.fields().items()})


@dataclass
class DecodeRows:
    """A decode step's per-sequence tensors as host arrays (numpy views, possibly of pinned memory), filled
    vectorised: at batch 256 a Python loop of small tensors per sequence would cost about a millisecond a step."""

    slots: np.ndarray  # int64
    block_table: np.ndarray  # int32 [seqs, width]
    context_lens: np.ndarray  # int32
    slot_mapping: np.ndarray  # int64

    @classmethod
    def empty(cls, seqs: int, width: int) -> DecodeRows:
        return cls(np.zeros(seqs, np.int64), np.zeros((seqs, width), np.int32), np.zeros(seqs, np.int32),
                   np.zeros(seqs, np.int64))

    def fields(self) -> dict[str, np.ndarray]:
        return {"slots": self.slots, "block_table": self.block_table, "context_lens": self.context_lens,
                "slot_mapping": self.slot_mapping}

    def fill(self, cached_lens: list[int], state_slots: list[int], block_tables: list[list[int]],
             block_size: int) -> None:
        """Write the first len(cached_lens) rows: each sequence's blocks up to its new token (block 0 past them)."""
        seqs = len(cached_lens)
        cached = np.asarray(cached_lens, dtype=np.int64)
        needed = cached // block_size + 1  # blocks holding cached + 1 tokens
        held = np.fromiter(map(len, block_tables), dtype=np.int64, count=seqs)
        short = np.flatnonzero(held < needed)
        if short.size:
            seq = int(short[0])
            raise ValueError(f"sequence {seq}: {cached_lens[seq] + 1} tokens need {needed[seq]} blocks of "
                             f"{block_size}; its block table has {held[seq]}")
        total = int(needed.sum())
        kept = (blocks[:count] for blocks, count in zip(block_tables, needed.tolist(), strict=True))
        flat = np.fromiter(chain.from_iterable(kept), dtype=np.int32, count=total)
        starts = np.repeat(needed.cumsum() - needed, needed)
        table = self.block_table[:seqs]
        table.fill(0)
        table[np.repeat(np.arange(seqs), needed), np.arange(total) - starts] = flat
        self.slots[:seqs] = state_slots
        self.context_lens[:seqs] = cached + 1
        last_block = table[np.arange(seqs), needed - 1].astype(np.int64)
        self.slot_mapping[:seqs] = last_block * block_size + cached % block_size


@dataclass
class StepContext:
    query_lens: list[int]  # new tokens per sequence this step, in batch order
    cached_lens: list[int]  # tokens already cached per sequence before this step
    state_slots: list[int]  # recurrent/conv state slot per sequence
    block_tables: list[list[int]]  # KV block ids per sequence, covering cached + new tokens
    block_size: int
    positions: torch.Tensor  # [total new tokens] absolute positions, int64
    decode: DecodeBatch | None = None  # set when every sequence decodes: layers then read tensors only, and the
    # flat rows are the sequences in order (row i is sequence i's one token)

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
        if self.decode is not None:
            return []
        offsets, decoded = self.token_offsets(), set(self.decoding)
        return [(offsets[i], offsets[i + 1], self.state_slots[i], self.cached_lens[i] > 0)
                for i in range(self.num_seqs) if i not in decoded and offsets[i] != offsets[i + 1]]

    @property
    def all_decode(self) -> bool:
        """Every sequence adds exactly one token on top of a cache."""
        return all(n == 1 for n in self.query_lens) and all(c > 0 for c in self.cached_lens)

    def with_decode_tensors(self) -> StepContext:
        """Attach the DecodeBatch when every sequence decodes (the fast path); otherwise unchanged."""
        if self.decode is None and self.query_lens and self.all_decode:
            self.decode = DecodeBatch.build(self.cached_lens, self.state_slots, self.block_tables, self.block_size,
                                            self.positions.device)
        return self

    @classmethod
    def for_prefill(cls, lengths: list[int], state_slots: list[int], block_tables: list[list[int]],
                    block_size: int, device: torch.device | str = "cpu") -> StepContext:
        """A step that processes whole prompts from an empty cache."""
        positions = torch.cat([torch.arange(n, dtype=torch.long) for n in lengths]).to(device)
        return cls(list(lengths), [0] * len(lengths), list(state_slots), block_tables, block_size, positions)


@dataclass(frozen=True)
class StepPlan:
    """One step as the scheduler planned it, in plain lists: what the driver sends every rank and what the model
    runner runs, in `LLM` and in a served rank alike."""

    token_ids: list[int]
    query_lens: list[int]
    cached_lens: list[int]
    state_slots: list[int]
    block_tables: list[list[int]]
    block_size: int
    positions: list[int]
    # Per sequence, None while a prompt is still being prefilled in chunks (no token this step), else whether its
    # token is drawn at random (True) or is the argmax (False): the last stage returns the sampler's logits for
    # exactly those rows, whole rows only for the draws. Flags, not SamplingParams: the plan is pickled to every
    # rank each step (at batch 256 the parameters were two thirds of its pickling time).
    draws: list[bool | None] = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def all_decode(self) -> bool:
        return bool(self.query_lens) and all(n == 1 for n in self.query_lens) and all(c > 0 for c in self.cached_lens)

    def context(self, device: torch.device | str) -> StepContext:
        """The step's context on `device`, with the decode tensors when every sequence decodes."""
        return StepContext(self.query_lens, self.cached_lens, self.state_slots, self.block_tables, self.block_size,
                           torch.tensor(self.positions, dtype=torch.long, device=device)).with_decode_tensors()
