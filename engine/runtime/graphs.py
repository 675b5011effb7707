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

import math

import torch

from engine.layers.caches import LayerCaches
from engine.layers.moe import QuantizedExperts
from engine.layers.norm import RMSNorm
from engine.models import RangeCausalLM
from engine.step_plan import DecodeBatch, DecodeRows, StepContext, StepPlan

LADDER = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def graph_sizes(max_num_seqs: int) -> list[int]:
    return [size for size in LADDER if size < max_num_seqs] + [max_num_seqs]


def can_capture(model: RangeCausalLM, device: torch.device | str) -> bool:
    """Capture needs every op free of host synchronisation: in bf16 on CUDA the experts' paths are (the grouped
    experts, the fused Triton ones), quantized experts only on their fused kernels (their loop reads the hit experts
    on the host). The model's dtype is its norms' (a range may start with an fp8 weight)."""
    dtype = next(module.weight.dtype for module in model.modules() if isinstance(module, RMSNorm))
    if torch.device(device).type != "cuda" or dtype != torch.bfloat16:
        return False
    return all(module.has_kernels for module in model.modules() if isinstance(module, QuantizedExperts))


class StagedInputs:
    """One graph's integer inputs (token ids on a first range, positions and the DecodeBatch) carved from one device
    buffer, with a pinned host twin of the same layout: a step fills the host arrays (numpy, vectorised) and moves
    them in one asynchronous copy, instead of a tensor and a blocking copy per field."""

    def __init__(self, size: int, width: int, token_ids: bool, device: torch.device):
        fields = [("positions", torch.long, (size,)), ("slots", torch.long, (size,)),
                  ("slot_mapping", torch.long, (size,)), ("context_lens", torch.int32, (size,)),
                  ("block_table", torch.int32, (size, width))]
        if token_ids:
            fields.insert(0, ("token_ids", torch.long, (size,)))
        offsets, total = [], 0
        for _, dtype, shape in fields:
            offsets.append(total)
            total += -(-math.prod(shape) * dtype.itemsize // 8) * 8  # every field 8-byte aligned
        self.device_bytes = torch.zeros(total, dtype=torch.uint8, device=device)
        self.host_bytes = torch.zeros(total, dtype=torch.uint8, pin_memory=True)

        def carve(buffer: torch.Tensor) -> dict[str, torch.Tensor]:
            return {name: buffer[offset:offset + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
                    for (name, dtype, shape), offset in zip(fields, offsets, strict=True)}

        self.device = carve(self.device_bytes)
        self.host = {name: tensor.numpy() for name, tensor in carve(self.host_bytes).items()}
        self.rows = DecodeRows(self.host["slots"], self.host["block_table"], self.host["context_lens"],
                               self.host["slot_mapping"])
        self.batch = DecodeBatch(self.device["slots"], self.device["block_table"], self.device["context_lens"],
                                 self.device["slot_mapping"])
        self.copied = torch.cuda.Event()  # the host arrays are free to refill once the last copy has left them
        self.copied.record()

    def load(self, plan: StepPlan, pad: int, block_size: int) -> None:
        """Fill the host arrays with the plan's sequences (then `pad` copies of its first) and copy them over."""
        def padded(values: list) -> list:
            return values + values[:1] * pad

        self.copied.synchronize()
        self.rows.fill(padded(plan.cached_lens), padded(plan.state_slots), padded(plan.block_tables), block_size)
        self.host["positions"][:] = padded(plan.cached_lens)
        if "token_ids" in self.host:
            self.host["token_ids"][:] = padded(plan.token_ids)
        self.device_bytes.copy_(self.host_bytes, non_blocking=True)
        self.copied.record()


class DecodeGraphs:
    def __init__(self, model: RangeCausalLM, caches: LayerCaches, block_size: int, max_num_seqs: int,
                 max_model_len: int, device: torch.device):
        self.model, self.caches, self.block_size, self.device = model, caches, block_size, device
        self.sizes = graph_sizes(max_num_seqs)
        width = -(-max_model_len // block_size)
        # Each size has its own inputs, so a step copies exactly its rows.
        self.staged = {size: StagedInputs(size, width, model.is_first, device) for size in self.sizes}
        self.hidden_inputs: dict[int, torch.Tensor] = {}
        if not model.is_first:
            dtype = next(model.parameters()).dtype
            self.hidden_inputs = {size: torch.zeros((size, model.config.hidden_size), dtype=dtype, device=device)
                                  for size in self.sizes}
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory pool
            self.graphs[size] = self._capture(size, pool)

    def _forward(self, size: int) -> tuple[torch.Tensor, ...]:
        staged = self.staged[size]
        ctx = StepContext([1] * size, [1] * size, [0] * size, [[0]] * size, self.block_size,
                          staged.device["positions"], staged.batch)
        inputs = staged.device["token_ids"] if self.model.is_first else self.hidden_inputs[size]
        hidden = self.model(inputs, ctx, self.caches)
        if not self.model.is_last:
            return (hidden,)
        logits = self.model.compute_logits(hidden, ctx).float()
        return logits, torch.argmax(logits, dim=-1)

    @torch.inference_mode()
    def _capture(self, size: int, pool: tuple) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
        self.staged[size].device["context_lens"].fill_(1)  # warm-up and capture read one cached token each
        # Warm-up on the stream the steps run on: Triton compiles its kernels, cuBLAS makes its handle. A stream of
        # its own would get a cuBLAS workspace (32 MiB) that torch never gives back, one per capture and build: on
        # the H200 rig that held 134 MB more after every rebuild.
        for _ in range(2):
            self._forward(size)
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
        self.staged[size].load(plan, size - count, self.block_size)
        if hidden is not None:
            inputs = self.hidden_inputs[size]
            inputs[:count].copy_(hidden)
            inputs[count:].copy_(hidden[:1].expand(size - count, -1))
        graph, outputs = self.graphs[size]
        graph.replay()
        return tuple(output[:count] for output in outputs)
