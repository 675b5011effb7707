"""One rank process: its layer range of the model, its KV and state pools, and its byte budget.

The driver sends it messages over a pipe ("build" a layout, run a "step", "measure" itself, "probe", "stop");
activations travel rank to rank over torch.distributed. A build keeps the modules of layers that stay, fills layers
it gains from the shared host image with a checksum check on arrival, rebuilds the pools for its new attention
layers, and enforces the rank's budget before it replaces anything. Weights and pools live packed in the rank's slab
(engine/memory/slab.py): the layers that stay move up or down in it, so no build leaves holes between them.
"""

from __future__ import annotations

import gc
import os
import traceback
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

import torch
from torch import nn

from engine.config import ModelConfig
from engine.errors import EngineError
from engine.layers.caches import CACHE_DTYPES
from engine.layers.merge import materialize, merge_projections
from engine.loader import build_model
from engine.memory.arena import Arena
from engine.memory.device import (
    ALLOCATOR_CONF,
    MemoryReader,
    allocator_pools,
    cap_cuda_memory,
    cuda_memory,
    prefer_expandable_segments,
    probe_headroom,
    reserve_blas_workspaces,
)
from engine.memory.host_image import HostImage
from engine.memory.kv_pool import KVPool
from engine.memory.slab import Slab, held_tensors
from engine.memory.state_pool import StatePool
from engine.models import RangeCausalLM
from engine.ranks.pipeline import TransportError, close_group, init_group, recv_hidden, send_hidden
from engine.runtime.runner import ModelRunner
from engine.runtime.sampler import StepLogits
from engine.step_plan import StepPlan
from engine.telemetry.stage_timer import StageTimer


@dataclass(frozen=True)
class RankLayout:
    """What one rank is told to become; every figure comes from the planner's prediction."""

    cut: tuple[int, ...]
    pool_tokens: int
    block_size: int
    num_slots: int
    kv_dtype: str
    state_dtype: str
    memory_bytes: int
    overhead_bytes: int
    workspace_bytes: int
    floor_bytes: int
    margin_bytes: int
    max_model_len: int = 0  # the decode graphs' block tables are this long (0: no graphs)
    rung: bool = False  # a ladder is armed: weights live in a fixed arena, refilled by one contiguous copy
    arena_bytes: int = 0  # the arena: the deepest rung's weights on this rank
    state_reserve_bytes: int = 0  # state slots held for the deepest rung beyond this rung's

    def layer_range(self, rank: int) -> range:
        start = sum(self.cut[:rank])
        return range(start, start + self.cut[rank])


class RankWorker:
    def __init__(self, rank: int, world: int, config: ModelConfig, image: HostImage, device: torch.device):
        if device.type == "cuda" and device.index is None:  # the driver calls and the allocator's cap need an index
            device = torch.device("cuda", torch.cuda.current_device())
        self.rank, self.world, self.config, self.image, self.device = rank, world, config, image, device
        self.model: RangeCausalLM | None = None
        self.runner: ModelRunner | None = None
        self.kv_pool: KVPool | None = None
        self.state_pool: StatePool | None = None
        self.layout: RankLayout | None = None
        self.arena = Arena(rank, config, image, device)
        self.slab: Slab | None = None  # made at the first build, as large as the rank's budget
        # Fault injection for tests: corrupt what arrives on this rank from the image in the first
        # reconfiguration after start-up (the start-up build itself stays clean).
        self.corrupt_arrivals = os.environ.get("SEAM_FAULT_CORRUPT_RANK") == str(rank)
        self.die_in_reconfiguration = os.environ.get("SEAM_FAULT_DIE_RANK") == str(rank)
        # ... and allocate one KV block fewer than the layout asks in the listed builds of this process ("1:0,2":
        # rank 1, at start-up and in the second build after it), so the driver's check against the prediction fires.
        short_rank, _, short_builds = os.environ.get("SEAM_FAULT_SHORT_POOL", "").partition(":")
        self.short_pool_builds = {int(n) for n in short_builds.split(",") if n} if short_rank == str(rank) else set()
        # ... and fail every step that carries this token id, on the last rank (after the transfers, so the process
        # group stays sound): a request that fails every step it is in.
        fail_token = os.environ.get("SEAM_FAULT_STEP_TOKEN")
        self.fail_token = int(fail_token) if fail_token and rank == world - 1 else None
        self.builds = 0
        self.timer = StageTimer(device)  # the last step's stage: the driver's StageLog keeps it

    # LayerCaches
    def kv(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv_pool.kv(layer_index)

    def state(self, layer_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.state_pool.state(layer_index)

    def build(self, layout: RankLayout) -> dict:
        """Become `layout`. A layout under the rank's floor is refused before anything changes; a build that fails
        after that leaves the rank holding nothing to serve, and the driver restores by building the previous
        layout again (its layers copied back from the host image)."""
        if self.die_in_reconfiguration and self.builds > 0:
            os._exit(17)  # fault injection: this rank dies in the middle of an operation
        if self.builds in self.short_pool_builds and layout.pool_tokens:
            layout = replace(layout, pool_tokens=layout.pool_tokens - layout.block_size)
        layers = layout.layer_range(self.rank)
        if self.device.type == "cuda":  # the build's own peak is reported: a transition must fit the cap too
            torch.cuda.reset_peak_memory_stats(self.device)
        model = build_model(self.config, layers.start, layers.stop, device="meta")
        model.tie_weights()  # a tied head counts once in the budget, as once loaded
        # The budget check prices the whole new layout on the meta device: a refused one leaves the running one
        # untouched.
        planned_pools = self._pools(layers, layout, "meta")
        planned = self._measure(model, *planned_pools, layout)
        if planned["free_bytes"] < layout.floor_bytes + layout.margin_bytes:
            raise EngineError(
                f"rank {self.rank} cannot clear its arming floor at cut {list(layout.cut)}: free "
                f"{planned['free_bytes']} B < floor {layout.floor_bytes} B + margin {layout.margin_bytes} B")
        # Then what the new layout does not keep is let go: the old pools (their contents are never needed again:
        # running sequences were preempted), the decode graphs that hold their addresses, and the layers it drops.
        # The layers that stay move within the slab to their places in the new packing, which holds at most the
        # larger of the two layouts at once (holding both pools did not fit rank 1 of the reference rig on the
        # H200, moving [28,20,16] -> [30,17,17]).
        kept, self.model = self.model, None
        self.runner = self.kv_pool = self.state_pool = None
        # A rung's weights are all views of the arena, refilled whole; leaving a ladder reloads every layer too (the
        # arena holds them unmerged, outside the slab).
        if not layout.rung and not (self.layout is not None and self.layout.rung):
            self._keep(model, kept)
        del kept
        self._hand_back()
        switch_s, parts = None, []
        if layout.rung:
            corrupt = self.corrupt_arrivals and self.builds > 0
            self.corrupt_arrivals &= not corrupt  # the fault fires once
            switch_s = self.arena.fill(model, layout.cut, layout.arena_bytes, layout.state_reserve_bytes, corrupt)
            loaded = list(model.layer_range)
        else:
            self.arena.release()
            parts = weight_parts(model)
        if self.slab is None:
            self.slab = Slab(self.device, layout.memory_bytes)
        # What stays moves to its place in the new packing; arrivals and pools are placed after it
        # (engine/memory/slab.py).
        arrangement = self.slab.arrange(parts, [pool.bytes for pool in planned_pools])
        if not layout.rung:
            loaded = self._fill(model, parts, arrangement.offsets)
        kv_pool, state_pool = self._pools(layers, layout, self.device, [
            self.slab.block(offset, pool.bytes) for offset, pool in zip(arrangement.tails, planned_pools, strict=True)])
        self.slab.trim(arrangement.end)
        self.model, self.kv_pool, self.state_pool, self.layout = model, kv_pool, state_pool, layout
        self.builds += 1
        # The same runner `LLM` uses, decode graphs captured now (before any request: see engine/runtime/graphs.py).
        self.runner = ModelRunner.prepare(model, self, self.device, block_size=layout.block_size,
                                          max_num_seqs=layout.num_slots, max_model_len=layout.max_model_len,
                                          cuda_graphs=layout.max_model_len > 0)
        measured = self.measure()
        measured["loaded_layers"] = loaded
        measured["switch_s"] = switch_s
        measured["copy_s"] = self.arena.copy_s if layout.rung else None
        measured["unpinned"] = {str(list(cut)): why for cut, why in self.arena.unpinned.items()}
        if self.device.type == "cuda":
            measured["build_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device)
        return measured

    def measure(self) -> dict:
        """What the rank holds now against its layout, as a build reports it (on CUDA, the allocator pool by pool)."""
        if self.device.type != "cuda":
            return self._measure(self.model, self.kv_pool, self.state_pool, self.layout)
        # What the rank let go is back with the card before it measures itself: NVML then sees what the rank holds
        # (on the H200 the old model, still referenced, and the allocator's cache of the old pools read as up to
        # 4.4 GB a rank after a cut change; once serving, the cached activations of its steps).
        self._hand_back()
        measured = self._measure(self.model, self.kv_pool, self.state_pool, self.layout)
        measured["allocator_pools"] = allocator_pools(self.device)  # torch's: everything but the slab
        measured["slab_mapped_bytes"] = self.slab.mapped_bytes
        return measured

    def _pools(self, layers: range, layout: RankLayout, device: torch.device | str,
               storages: list[torch.Tensor] | None = None) -> tuple[KVPool, StatePool]:
        kv_storage, state_storage = storages or (None, None)
        return (KVPool(self.config, layers, layout.pool_tokens, layout.block_size, CACHE_DTYPES[layout.kv_dtype],
                       device, kv_storage),
                StatePool(self.config, layers, layout.num_slots, CACHE_DTYPES[layout.state_dtype], device,
                          state_storage))

    @staticmethod
    def _keep(model: RangeCausalLM, old: RangeCausalLM | None) -> None:
        """Move into `model` the modules of the layers (and embeddings, norm, head) `old` holds that it needs."""
        if old is None:
            return
        for index in set(old.layer_range) & set(model.layer_range):
            model.layers[str(index)] = old.layers[str(index)]
        for part in ("embed_tokens", "norm", "lm_head"):
            if getattr(model, part) is not None and getattr(old, part) is not None:
                setattr(model, part, getattr(old, part))

    def _hand_back(self) -> None:
        """Return what the rank let go to the card (on CUDA), reference cycles included, so it is really gone."""
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _fill(self, model: RangeCausalLM, parts: list[tuple[str, nn.Module]], offsets: dict[str, int]) -> list[int]:
        """Place the parts still on the meta device at their offsets in the slab and copy them in from the host
        image, verified; the layers it loaded. A layer was merged on the meta device (before it was priced), so each
        merged tensor is placed once and filled in place (engine/layers/merge.py, materialize)."""
        loaded = []
        for name, part in parts:
            if name == "lm_head":
                model.tie_weights()  # a tied head is the embedding placed just before it
            if not any(tensor.is_meta for tensor in held_tensors(part)):
                continue
            for param_name, param in materialize(part, self.slab.allocator(offsets[name])):
                self._arrive(f"{name}.{param_name}", param)
            if name.startswith("layers."):
                loaded.append(int(name.split(".")[1]))
        model.tie_weights()
        return loaded

    def _source(self, name: str) -> str:
        return "embed_tokens.weight" if name == "lm_head.weight" and self.config.tie_word_embeddings else name

    def _arrive(self, name: str, target: torch.Tensor) -> None:
        """Copy one parameter from the host image into `target` on the device and check it against the image's
        checksum (`target` may be a view of a merged tensor)."""
        source = self._source(name)
        with torch.no_grad():
            target.copy_(self.image.tensor(source))
            if self.corrupt_arrivals and self.builds > 0:
                target.view(-1)[0] += 1.0
                self.corrupt_arrivals = False
        self.image.verify(source, target)

    def _measure(self, model: RangeCausalLM, kv_pool: KVPool, state_pool: StatePool, layout: RankLayout) -> dict:
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        # What the arena holds beyond this rung's weights, and the state reserve, still cost memory.
        arena = (layout.arena_bytes - weights + layout.state_reserve_bytes) if layout.rung else 0
        used = weights + arena + kv_pool.bytes + state_pool.bytes + layout.workspace_bytes
        device_figures = ({**cuda_memory(self.device), "allocator_conf": os.environ.get(ALLOCATOR_CONF)}
                          if self.device.type == "cuda" else {})
        return {
            **device_figures,
            "rank": self.rank, "pid": os.getpid(), "layers": [model.start, model.stop], "weights_bytes": weights,
            "kv_pool_bytes": kv_pool.bytes, "kv_pool_tokens": kv_pool.capacity_tokens,
            "state_pool_bytes": state_pool.bytes, "state_slots": state_pool.num_slots, "arena_bytes": arena,
            "workspace_bytes": layout.workspace_bytes, "overhead_bytes": layout.overhead_bytes,
            "total_bytes": layout.memory_bytes,
            "free_bytes": layout.memory_bytes - layout.overhead_bytes - used,
            "attention_layers": len(kv_pool.attention_layers),
        }

    def step(self, plan: StepPlan) -> StepLogits | None:
        """Run this rank's layers for one step; the last rank returns the sampler's logits."""
        hidden = None
        if self.rank > 0:
            hidden = recv_hidden(len(plan.token_ids), self.config.hidden_size, self.config.torch_dtype, self.device,
                                 self.rank - 1)
        if self.fail_token is not None and self.fail_token in plan.token_ids:
            raise EngineError(f"fault injection: rank {self.rank} fails steps with token {self.fail_token}")
        with self.timer:
            out = self.runner.run(plan, hidden)
        if self.rank < self.world - 1:
            send_hidden(out, self.rank + 1)
            return None
        return out


def weight_parts(model: RangeCausalLM) -> list[tuple[str, nn.Module]]:
    """The model's weights in the slab's order (engine/memory/slab.py), each fresh layer merged on the meta device
    first:
    its merged tensors are what the slab places."""
    parts = [("embed_tokens", model.embed_tokens)] if model.embed_tokens is not None else []
    for index in model.layer_range:
        layer = model.layers[str(index)]
        if any(param.is_meta for param in layer.parameters()):
            merge_projections(layer)
        parts.append((f"layers.{index}", layer))
    return parts + [(name, getattr(model, name)) for name in ("norm", "lm_head") if getattr(model, name) is not None]


def rank_main(rank: int, world: int, init_method: str, conn: Connection, checkpoint: str, image: HostImage,
              device: str, memory_bytes: int, shared_device: bool = False) -> None:
    """Entry point of a rank process: serve the driver's messages until told to stop."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    target = torch.device(device)
    if target.type == "cuda":
        torch.cuda.memory._set_allocator_settings(prefer_expandable_segments())
        torch.cuda.set_device(target)
        cap_cuda_memory(target, memory_bytes)
        reserve_blas_workspaces(target)
    init_group(rank, world, init_method, target, shared_device=shared_device)
    worker = RankWorker(rank, world, ModelConfig.from_pretrained(checkpoint), image, target)
    memory = MemoryReader(target)
    conn.send(("ready",))  # the driver times builds and steps from here on, not the start-up
    try:
        while True:
            kind, payload = conn.recv()
            if kind == "stop":
                break
            try:
                if kind == "build":
                    measured = worker.build(payload)
                    if target.type == "cuda":  # torch's allocator gets the budget the slab leaves
                        cap_cuda_memory(target, memory_bytes - worker.slab.mapped_bytes)
                    conn.send(("ok", measured))
                elif kind == "step":  # each reply carries fresh device memory figures every READ_EVERY_S
                    conn.send(("ok", (worker.step(payload), memory.read(), worker.timer.ms)))
                elif kind == "measure":
                    conn.send(("ok", worker.measure()))
                elif kind == "probe":
                    conn.send(("ok", probe_headroom(target, payload) if target.type == "cuda" else None))
            except Exception as error:  # reported to the driver, which decides (roll back, restart the ranks, fail)
                conn.send(("error", f"{type(error).__name__}: {error}", traceback.format_exc(),
                           isinstance(error, TransportError)))
    except (EOFError, KeyboardInterrupt):
        pass  # the driver went away
    finally:
        close_group()
