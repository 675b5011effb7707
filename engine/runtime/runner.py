"""Runs one step through one layer range: what `LLM` runs for its single rank and what every served rank runs.

All-decode steps replay a captured CUDA graph where there is one (engine/runtime/graphs.py); every other step runs
eagerly.
A range that ends the model returns the sampler's StepLogits (argmax on the device, full rows only where a request
samples); any other returns the hidden states for the next rank.
"""

from __future__ import annotations

import torch

from engine.layers.caches import LayerCaches
from engine.models import RangeCausalLM
from engine.runtime.graphs import DecodeGraphs, can_capture
from engine.runtime.sampler import StepLogits
from engine.step_plan import StepPlan


class ModelRunner:
    def __init__(self, model: RangeCausalLM, caches: LayerCaches, device: torch.device | str,
                 graphs: DecodeGraphs | None = None):
        self.model, self.caches, self.device = model, caches, torch.device(device)
        self.graphs = graphs  # CUDA graphs of the decode step, when captured

    @classmethod
    def prepare(cls, model: RangeCausalLM, caches: LayerCaches, device: torch.device | str, *, block_size: int,
                max_num_seqs: int, max_model_len: int, cuda_graphs: bool = True) -> ModelRunner:
        """The runner for a model whose weights are in place and pools allocated: decode graphs captured where the
        device allows (weights must not move after this, nor the pools be replaced)."""
        graphs = None
        if cuda_graphs and can_capture(model, device):
            graphs = DecodeGraphs(model, caches, block_size, max_num_seqs, max_model_len, torch.device(device))
        return cls(model, caches, device, graphs)

    @torch.inference_mode()
    def run(self, plan: StepPlan, hidden: torch.Tensor | None = None) -> torch.Tensor | StepLogits:
        """Hidden states [tokens, hidden] for the next rank, or on the last range the sampler's StepLogits.
        `hidden` is the previous rank's output (None on the first range, which reads the plan's token ids)."""
        if self.graphs is not None and plan.all_decode and self.graphs.fits(plan.num_seqs):
            outputs = self.graphs.run(plan, hidden)
            return outputs[0] if not self.model.is_last else StepLogits.take(outputs[0], plan.draws, outputs[1])
        ctx = plan.context(self.device)
        if hidden is None:
            hidden = torch.tensor(plan.token_ids, dtype=torch.long, device=self.device)
        hidden = self.model(hidden, ctx, self.caches)
        if not self.model.is_last:
            return hidden
        return StepLogits.take(self.model.compute_logits(hidden, ctx).float(), plan.draws)

