"""CUDA graphs of the decode step, one per batch size of a small ladder, captured before the engine serves.

A decode step is a few hundred small kernels; launched one by one from Python its time is launch overhead, not
memory traffic. Captured once per batch size over fixed input buffers and replayed, it costs one launch. A batch
between two captured sizes runs in the next size up, padded with copies of its first sequence: a copy computes the
same values and writes the same KV row and state slot as the original, so padding changes nothing.

Capture happens before any request: its warm-up runs write into block 0 and state slot 0, which a sequence's prefill
overwrites before it reads them.
"""

from __future__ import annotations

import torch

from engine.caches import LayerCaches
from engine.context import DecodeBatch, StepContext
from engine.models import RangeCausalLM

LADDER = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def graph_sizes(max_num_seqs: int) -> list[int]:
    return [size for size in LADDER if size < max_num_seqs] + [max_num_seqs]


class DecodeGraphs:
    def __init__(self, model: RangeCausalLM, caches: LayerCaches, block_size: int, max_num_seqs: int,
                 max_model_len: int, device: torch.device):
        self.model, self.caches, self.block_size, self.device = model, caches, block_size, device
        self.sizes = graph_sizes(max_num_seqs)
        self.width = -(-max_model_len // block_size)
        most = self.sizes[-1]
        self.token_ids = torch.zeros(most, dtype=torch.long, device=device)
        self.positions = torch.zeros(most, dtype=torch.long, device=device)
        self.buffers = DecodeBatch(
            slots=torch.zeros(most, dtype=torch.long, device=device),
            block_table=torch.zeros((most, self.width), dtype=torch.int32, device=device),
            context_lens=torch.ones(most, dtype=torch.int32, device=device),
            slot_mapping=torch.zeros(most, dtype=torch.long, device=device))
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory pool
            self.graphs[size] = self._capture(size, pool)

    def _context(self, size: int) -> StepContext:
        b = self.buffers
        decode = DecodeBatch(b.slots[:size], b.block_table[:size], b.context_lens[:size],
                             b.slot_mapping[:size])
        return StepContext([1] * size, [1] * size, [0] * size, [[0]] * size, self.block_size, self.positions[:size],
                           decode)

    def _forward(self, size: int) -> torch.Tensor:
        ctx = self._context(size)
        hidden = self.model(self.token_ids[:size], ctx, self.caches)
        return self.model.compute_logits(hidden, ctx).float()

    @torch.inference_mode()
    def _capture(self, size: int, pool: tuple) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: Triton compiles its kernels, cuBLAS makes its handles
                self._forward(size)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            logits = self._forward(size)
        return graph, logits

    def fits(self, num_seqs: int) -> bool:
        return num_seqs <= self.sizes[-1]

    @torch.inference_mode()
    def run(self, token_ids: list[int], ctx: StepContext) -> torch.Tensor:
        """Logits [seqs, vocab] of one all-decode step (ctx from the scheduler's batch, lists only)."""
        count = len(token_ids)
        size = next(s for s in self.sizes if s >= count)
        pad = size - count

        def padded(values: list) -> list:
            return values + values[:1] * pad

        host = DecodeBatch.build(padded(ctx.cached_lens), padded(ctx.state_slots), padded(ctx.block_tables),
                                 self.block_size, "cpu", width=self.width)
        self.token_ids[:size].copy_(torch.tensor(padded(token_ids)), non_blocking=True)
        self.positions[:size].copy_(torch.tensor(padded(ctx.cached_lens)), non_blocking=True)
        for name in ("slots", "block_table", "context_lens", "slot_mapping"):
            getattr(self.buffers, name)[:size].copy_(getattr(host, name), non_blocking=True)
        graph, logits = self.graphs[size]
        graph.replay()
        return logits[:count]
