"""CUDA graphs of the decode step, one per batch size of a small ladder, captured before the stage serves.

A decode step is a few hundred small kernels; launched one by one from Python its time is launch overhead, not
memory traffic. Captured once per batch size over fixed input buffers and replayed, it costs one launch. A batch
between two captured sizes runs in the next size up, padded with copies of its first sequence: a copy computes the
same values and writes the same KV row and state slot as the original, so padding changes nothing.

The graphs serve any layer range: the first range reads token ids, a later one the previous rank's hidden states;
the last range ends in the logits and their argmax (greedy sampling happens inside the graph), the others in the
hidden states they send on.

Capture happens before any request: its warm-up runs write into block 0 and state slot 0, which a sequence's prefill
overwrites before it reads them.
"""

from __future__ import annotations

import torch

from engine.caches import LayerCaches
from engine.context import DecodeBatch, StepContext, StepPlan
from engine.models import RangeCausalLM

LADDER = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def graph_sizes(max_num_seqs: int) -> list[int]:
    return [size for size in LADDER if size < max_num_seqs] + [max_num_seqs]


def can_capture(model: RangeCausalLM, device: torch.device | str) -> bool:
    """Capture needs every op free of host synchronisation; the grouped experts that make MoE so are bf16-only."""
    weight = next(model.parameters())
    return torch.device(device).type == "cuda" and weight.dtype == torch.bfloat16


class DecodeGraphs:
    def __init__(self, model: RangeCausalLM, caches: LayerCaches, block_size: int, max_num_seqs: int,
                 max_model_len: int, device: torch.device):
        self.model, self.caches, self.block_size, self.device = model, caches, block_size, device
        self.sizes = graph_sizes(max_num_seqs)
        self.width = -(-max_model_len // block_size)
        most = self.sizes[-1]
        if model.is_first:
            self.inputs = torch.zeros(most, dtype=torch.long, device=device)
        else:
            dtype = next(model.parameters()).dtype
            self.inputs = torch.zeros((most, model.config.hidden_size), dtype=dtype, device=device)
        self.positions = torch.zeros(most, dtype=torch.long, device=device)
        self.buffers = DecodeBatch(
            slots=torch.zeros(most, dtype=torch.long, device=device),
            block_table=torch.zeros((most, self.width), dtype=torch.int32, device=device),
            context_lens=torch.ones(most, dtype=torch.int32, device=device),
            slot_mapping=torch.zeros(most, dtype=torch.long, device=device))
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory pool
            self.graphs[size] = self._capture(size, pool)

    def _context(self, size: int) -> StepContext:
        b = self.buffers
        decode = DecodeBatch(b.slots[:size], b.block_table[:size], b.context_lens[:size],
                             b.slot_mapping[:size])
        return StepContext([1] * size, [1] * size, [0] * size, [[0]] * size, self.block_size, self.positions[:size],
                           decode)

    def _forward(self, size: int) -> tuple[torch.Tensor, ...]:
        ctx = self._context(size)
        hidden = self.model(self.inputs[:size], ctx, self.caches)
        if not self.model.is_last:
            return (hidden,)
        logits = self.model.compute_logits(hidden, ctx).float()
        return logits, torch.argmax(logits, dim=-1)

    @torch.inference_mode()
    def _capture(self, size: int, pool: tuple) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: Triton compiles its kernels, cuBLAS makes its handles
                self._forward(size)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            outputs = self._forward(size)
        return graph, outputs

    def fits(self, num_seqs: int) -> bool:
        return num_seqs <= self.sizes[-1]

    @torch.inference_mode()
    def run(self, plan: StepPlan, hidden: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Replay one all-decode step: (hidden,) on a range that does not end the model, else (logits, argmax),
        each cut to the plan's sequences. `hidden` is the previous rank's output where this range is not first."""
        count = plan.num_seqs
        size = next(s for s in self.sizes if s >= count)
        pad = size - count

        def padded(values: list) -> list:
            return values + values[:1] * pad

        host = DecodeBatch.build(padded(plan.cached_lens), padded(plan.state_slots), padded(plan.block_tables),
                                 self.block_size, "cpu", width=self.width)
        if hidden is None:
            self.inputs[:size].copy_(torch.tensor(padded(plan.token_ids)), non_blocking=True)
        else:
            self.inputs[:count].copy_(hidden)
            self.inputs[count:size].copy_(hidden[:1].expand(pad, -1))
        self.positions[:size].copy_(torch.tensor(padded(plan.cached_lens)), non_blocking=True)
        for name in ("slots", "block_table", "context_lens", "slot_mapping"):
            getattr(self.buffers, name)[:size].copy_(getattr(host, name), non_blocking=True)
        graph, outputs = self.graphs[size]
        graph.replay()
        return tuple(output[:count] for output in outputs)
