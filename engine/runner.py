"""Runs one scheduled batch through one rank's layer range and returns next-token logits."""

from __future__ import annotations

import torch

from engine.caches import LayerCaches
from engine.context import StepContext
from engine.graphs import DecodeGraphs
from engine.models import RangeCausalLM
from engine.scheduler import Batch


class ModelRunner:
    def __init__(self, model: RangeCausalLM, caches: LayerCaches, block_size: int, device: torch.device | str,
                 graphs: DecodeGraphs | None = None):
        self.model, self.caches = model, caches
        self.block_size, self.device = block_size, torch.device(device)
        self.graphs = graphs  # CUDA graphs of the decode step, when captured

    def context(self, batch: Batch, on_device: bool = True) -> tuple[torch.Tensor | list[int], StepContext]:
        """The step's flat token ids and its context, from what the scheduler planned (ids as a list, positions on
        the host, when not `on_device`: what a graph replay copies into its own buffers)."""
        ids, positions = [], []
        for seq, cached, count in zip(batch.seqs, batch.cached_lens, batch.query_lens, strict=True):
            ids.extend(seq.tokens[cached:cached + count])
            positions.extend(range(cached, cached + count))
        ctx = StepContext(
            query_lens=list(batch.query_lens), cached_lens=list(batch.cached_lens),
            state_slots=[seq.state_slot or 0 for seq in batch.seqs],
            block_tables=[list(seq.block_table) for seq in batch.seqs], block_size=self.block_size,
            positions=torch.tensor(positions, dtype=torch.long, device=self.device if on_device else "cpu"),
        )
        return (torch.tensor(ids, dtype=torch.long, device=self.device) if on_device else ids), ctx

    @torch.inference_mode()
    def run(self, batch: Batch) -> torch.Tensor:
        """Logits [num_seqs, vocab] of each sequence's last new token (float32)."""
        if self.graphs is not None and batch.seqs and self.graphs.fits(len(batch.seqs)):
            ids, ctx = self.context(batch, on_device=False)
            if ctx.all_decode:
                return self.graphs.run(ids, ctx)
        token_ids, ctx = self.context(batch)
        ctx.with_decode_tensors()
        hidden = self.model(token_ids, ctx, self.caches)
        return self.model.compute_logits(hidden, ctx).float()
