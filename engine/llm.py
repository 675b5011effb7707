"""`LLM`: the engine for Python users — one rank, pools sized by the planner, continuous batching.

    llm = LLM("path/to/checkpoint")
    outputs = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8))
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.errors import EngineError
from engine.layers.caches import CACHE_DTYPES
from engine.layers.merge import merge_projections
from engine.loader import load_model
from engine.memory.kv_pool import KVPool
from engine.memory.state_pool import StatePool
from engine.runtime.block_manager import BlockManager, SlotManager
from engine.runtime.runner import ModelRunner
from engine.runtime.sampler import Sampler, SamplingParams, TokenLogprobs
from engine.runtime.scheduler import Scheduler
from engine.runtime.sequence import Sequence
from engine.runtime.text import CheckpointText
from solvers.capacity import CutPricer, PoolResult
from solvers.rig import Rig, load_rig
from solvers.units import parse_size


@dataclass
class Completion:
    request_id: int
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str
    text: str | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per token, when SamplingParams.logprobs is set


class LLM:
    def __init__(self, checkpoint: str | Path, *, rig: str | Rig = "cpu-single", memory: str | int | None = None,
                 device: str = "cpu", dtype: torch.dtype | None = None, cuda_graphs: bool = True,
                 deterministic: bool = False, **shape_overrides: int | str):
        """`deterministic`: one sequence a step (engine/runtime/scheduler.py), so a sequence's tokens are its batch-1
        run's whatever else is submitted."""
        self.checkpoint = Path(checkpoint)
        self.config = ModelConfig.from_pretrained(self.checkpoint)
        self.text = CheckpointText(self.checkpoint, self.config.vocab_size)
        self.rig = _single_rank(load_rig(rig) if isinstance(rig, str) else rig, memory)
        self.shape = replace(self.rig.shape, **shape_overrides)
        # The planner prices this exact layout; the pools below are allocated to its prediction.
        self.plan: PoolResult = CutPricer(self.config.census, self.rig, self.shape).price((self.config.num_layers,))
        if not self.plan.feasible:
            raise EngineError(f"rig {self.rig.name!r} cannot serve {self.checkpoint}: " + "; ".join(self.plan.reasons))
        layers = range(self.config.num_layers)
        kv_dtype = CACHE_DTYPES[self.shape.kv_dtype or self.config.dtype]
        state_dtype = CACHE_DTYPES[self.shape.state_dtype or self.config.dtype]
        self.kv_pool = KVPool(self.config, layers, self.plan.pool_tokens or 0, self.shape.block_size, kv_dtype, device)
        self.state_pool = StatePool(self.config, layers, self.shape.max_num_seqs, state_dtype, device)
        self.blocks = BlockManager(self.kv_pool.num_blocks, self.shape.block_size,
                                   tracks_kv=bool(self.kv_pool.attention_layers))
        self.slots = SlotManager(self.shape.max_num_seqs)
        self.model = load_model(self.checkpoint, device=device, dtype=dtype)
        merge_projections(self.model)
        self.runner = ModelRunner.prepare(self.model, self, device, block_size=self.shape.block_size,
                                          max_num_seqs=self.shape.max_num_seqs,
                                          max_model_len=self.shape.max_model_len, cuda_graphs=cuda_graphs)
        self.scheduler = Scheduler(
            self.blocks, self.slots, max_num_seqs=self.shape.max_num_seqs,
            max_num_batched_tokens=self.shape.max_num_batched_tokens, max_model_len=self.shape.max_model_len,
            eos_token_ids=self.text.eos_ids, deterministic=deterministic)
        self.sampler = Sampler()
        self.tokenizer = self.text.tokenizer
        self._next_id = 0

    # LayerCaches: the model reads its layers' caches straight from the pools.
    def kv(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv_pool.kv(layer_index)

    def state(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.state_pool.state(layer_index)

    def submit(self, prompt: list[int] | str, params: SamplingParams) -> Sequence:
        """Queue one request; refused now (EngineRequestError) if its lifetime can never fit."""
        seq = Sequence(self._next_id, self.text.prompt_ids(prompt), params)
        self.scheduler.add(seq)
        self._next_id += 1
        return seq

    def step(self) -> list[Sequence]:
        """Run one scheduled batch; return the sequences it finished."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        logits = self.runner.run(batch.plan(self.shape.block_size))
        ready = [i for i in range(len(batch.seqs)) if batch.completes_prompt(i)]
        tokens = self.sampler.sample(logits, [batch.seqs[i] for i in ready])
        finished = self.scheduler.commit(batch, {batch.seqs[i].seq_id: t for i, t in zip(ready, tokens, strict=True)})
        for seq in finished:
            self.sampler.release(seq.seq_id)
        return finished

    def generate(self, prompts: list[list[int]] | list[str],
                 sampling: SamplingParams | list[SamplingParams] | None = None) -> list[Completion]:
        """Run every prompt to completion with continuous batching; outputs in prompt order."""
        params = sampling if isinstance(sampling, list) else [sampling or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise EngineError(f"{len(prompts)} prompts but {len(params)} sampling parameter sets")
        seqs = [self.submit(prompt, param) for prompt, param in zip(prompts, params, strict=True)]
        while self.scheduler.has_work:
            self.step()
        return [Completion(s.seq_id, s.prompt_ids, s.output_ids, s.finish_reason or "length",
                           self.decode(s.output_ids) if self.tokenizer else None, s.logprobs) for s in seqs]

    def encode(self, text: str) -> list[int]:
        return self.text.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.text.decode(ids)


def _single_rank(rig: Rig, memory: str | int | None) -> Rig:
    if rig.size != 1:
        raise EngineError(f"rig {rig.name!r} has {rig.size} ranks; LLM runs one rank (serve a multi-rank rig with "
                          "`python -m engine serve`)")
    if memory is None:
        return rig
    return replace(rig, ranks=(replace(rig.ranks[0], memory_bytes=parse_size(memory, "memory")),))

