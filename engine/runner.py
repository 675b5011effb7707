"""Runs one scheduled batch through one rank's layer range and returns next-token logits."""

from __future__ import annotations

import torch

from engine.caches import LayerCaches
from engine.context import StepContext
from engine.models import RangeCausalLM
from engine.scheduler import Batch


class ModelRunner:
    def __init__(self, model: RangeCausalLM, caches: LayerCaches, block_size: int, device: torch.device | str):
        self.model, self.caches = model, caches
        self.block_size, self.device = block_size, torch.device(device)

    def context(self, batch: Batch) -> tuple[torch.Tensor, StepContext]:
        """The step's flat token ids and its context, from what the scheduler planned."""
        ids, positions = [], []
        for seq, cached, count in zip(batch.seqs, batch.cached_lens, batch.query_lens, strict=True):
            ids.extend(seq.tokens[cached:cached + count])
            positions.extend(range(cached, cached + count))
        ctx = StepContext(
            query_lens=list(batch.query_lens), cached_lens=list(batch.cached_lens),
            state_slots=[seq.state_slot or 0 for seq in batch.seqs],
            block_tables=[list(seq.block_table) for seq in batch.seqs], block_size=self.block_size,
            positions=torch.tensor(positions, dtype=torch.long, device=self.device),
        )
        return torch.tensor(ids, dtype=torch.long, device=self.device), ctx

    @torch.inference_mode()
    def run(self, batch: Batch) -> torch.Tensor:
        """Logits [num_seqs, vocab] of each sequence's last new token (float32)."""
        token_ids, ctx = self.context(batch)
        hidden = self.model(token_ids, ctx, self.caches)
        return self.model.compute_logits(hidden, ctx).float()
