"""The driver: one scheduler for the whole pipeline, the rank processes, and the engine loop.

It starts one process per rank of the rig (torch.distributed between them), sizes every pool from
the planner's prediction for the cut, verifies what the ranks measured against it, and runs steps:
schedule -> ranks compute stage by stage -> the last rank's logits are sampled here. Requests come
in from any thread through `submit`; reconfiguration (engine/control/operations.py) runs between steps.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from pathlib import Path

from contracts.control import EngineState, Health, Operation
from contracts.layout import ServingShape, layout_fingerprint
from contracts.plan import PlanReply
from contracts.telemetry import Snapshot
from engine.config import ModelConfig
from engine.control.health import StepHealth
from engine.control.operations import Operations
from engine.control.protocol import RequestHandle
from engine.control.recovery import verify
from engine.control.snapshot import build_snapshot, build_state
from engine.errors import EngineError, EngineRequestError
from engine.memory.host_image import HostImage
from engine.ranks.group import RankGroup
from engine.ranks.rank import RankLayout
from engine.runtime.block_manager import BlockManager, SlotManager
from engine.runtime.sampler import Sampler, SamplingParams
from engine.runtime.scheduler import Batch, Scheduler
from engine.runtime.sequence import Sequence
from engine.runtime.text import CheckpointText
from engine.step_plan import StepPlan
from engine.telemetry.latency import LatencyLog
from engine.telemetry.metrics import EngineMetrics
from engine.telemetry.stage_timer import StageLog
from solvers.capacity import CutPricer, PoolResult
from solvers.frontier import default_timing
from solvers.ladder import Ladder, price_ladder
from solvers.rig import Rig

log = logging.getLogger("seam.engine")
THROUGHPUT_WINDOW_S = 5.0


class PipelineDriver:
    def __init__(self, checkpoint: str | Path, rig: Rig, cut: tuple[int, ...] | None = None,
                 shape: ServingShape | None = None, ladder: list[tuple[int, ...]] | None = None,
                 image: HostImage | None = None, deterministic: bool = False):
        """`deterministic`: one sequence a step (engine/runtime/scheduler.py), so its tokens never depend on what
        else is served."""
        self.checkpoint = Path(checkpoint)
        self.config = ModelConfig.from_pretrained(self.checkpoint)
        self.census = self.config.census
        self.rig = rig
        self.model_name = self.checkpoint.name
        self._shape = shape or rig.shape
        self.notes: list[str] = []
        self.deterministic = deterministic
        if deterministic:
            self.notes.append("deterministic mode: one sequence a step, so greedy tokens never depend on what else is "
                              "served (throughput is batch 1's)")
        if cut is None:
            cut, note = rig.incumbent_for(self.config.num_layers)
            self.notes += [note] if note else []
        self._cut = tuple(cut)
        self.rungs = [tuple(rung) for rung in ladder or []]
        if self.rungs and self.cut not in self.rungs:
            raise EngineError(f"the serving cut {list(self.cut)} must be a rung of the ladder "
                              f"{[list(r) for r in self.rungs]}")
        self.text = CheckpointText(self.checkpoint, self.config.vocab_size)
        self.eos_ids = self.text.eos_ids
        self.lock = threading.RLock()
        self.wake = threading.Event()
        self.sampler = Sampler()
        self.handles: dict[int, RequestHandle] = {}
        self.cancelled: dict[int, str] = {}  # request id -> the reason it ends with (`cancel`)
        self.ids = itertools.count()
        self._phase = "starting"
        # Fresh at every start: the console tells by it that the engine restarted (and lost its operations) under a
        # job it was following (docs/console.md, "Trust model").
        self.boot_id = uuid.uuid4().hex
        self.snapshot_seq = itertools.count(1)
        self.last_seq = 0
        self._throughput: deque[tuple[float, int, int]] = deque()  # (when, prefill tokens, decode tokens) per step
        self.device_memory: dict[int, dict] = {}  # rank -> its latest real device figures (CUDA ranks only)
        self.stages = StageLog()  # each rank's stage time in recent steps, for calibrating the timing model
        self.latency = LatencyLog()  # recent requests' time to first token and between tokens
        self.metrics = EngineMetrics(self.model_name, [spec.name for spec in rig.ranks])  # /metrics' counters
        self.step_health = StepHealth()
        self.ops = Operations(self, self.metrics)
        prediction, layouts = self.layouts(self.cut, self.shape)  # refuses an infeasible start
        # In shared memory: every rank process reads this one image (rung images are pinned in place). A ready image
        # (HostImage.random, for a rig emulated at full size) can be handed in instead of the checkpoint's weights.
        self.image = image or HostImage.build(self.checkpoint, rungs=self.rungs)
        self.ranks = RankGroup(self.rig, self.checkpoint, self.image)
        measured = self.ranks.call_all("build", layouts)
        problems = verify(prediction, measured)
        if problems:
            self.shutdown()
            raise EngineError("the ranks do not match the planner's prediction: " + "; ".join(problems))
        self.adopt(self.cut, self.shape, prediction, measured)
        self._phase = "serving"
        self._stop = False
        self.loop = threading.Thread(target=self._loop, name="seam-engine-loop", daemon=True)
        self.loop.start()

    # --- the layout served: written by `adopt` only -----------------------------------------------
    @property
    def cut(self) -> tuple[int, ...]:
        return self._cut

    @property
    def shape(self) -> ServingShape:
        return self._shape

    @property
    def prediction(self) -> PoolResult:
        """The planner's prediction for the layout served."""
        return self._prediction

    @property
    def measured(self) -> list[dict]:
        """Each rank's figures for the layout it serves, as its build reported them."""
        return self._measured

    @property
    def phase(self) -> str:
        """starting | serving | broken, or the phase of the operation running (engine/control/operations.py); written
        by set_phase, resume and mark_broken."""
        return self._phase

    @property
    def max_model_len(self) -> int:
        return self.shape.max_model_len

    # --- layout arithmetic: everything comes from the planner ------------------------------------

    def ladder(self, shape: ServingShape | None = None) -> Ladder | None:
        """The armed ladder priced at `shape` (default: the current one), or None when none is armed."""
        if not self.rungs:
            return None
        # Rung speeds come from the rig's stage times, rescaled per layer when its incumbent is for another depth.
        timing = default_timing(self.rig, self.rig.incumbent_for(self.config.num_layers)[0], [])
        return price_ladder(self.census, self.rig, self.rungs, shape or self.shape, timing=timing)

    def layouts(self, cut: tuple[int, ...], shape: ServingShape) -> tuple[PoolResult, list[RankLayout]]:
        ladder = self.ladder(shape)
        if ladder is not None:
            if tuple(cut) not in self.rungs:
                raise EngineError(f"cut {list(cut)} is not a rung of the armed ladder {[list(r) for r in self.rungs]}")
            prediction = ladder.rung(cut).pool
        else:
            prediction = CutPricer(self.census, self.rig, shape).price(cut)
        if not prediction.feasible:
            raise EngineError(f"cut {list(cut)} is refused by the planner: " + "; ".join(prediction.reasons))
        kv_dtype = shape.kv_dtype or self.census.dtype
        state_dtype = shape.state_dtype or self.census.dtype
        layouts = [RankLayout(tuple(cut), prediction.pool_tokens or 0, shape.block_size, shape.max_num_seqs,
                              kv_dtype, state_dtype, r.budget_bytes, r.overhead_bytes, r.workspace_bytes,
                              r.floor.bytes, r.margin_bytes, max_model_len=shape.max_model_len,
                              rung=ladder is not None,
                              arena_bytes=ladder.image_bytes[r.rank] if ladder else 0,
                              state_reserve_bytes=(ladder.pinned_bytes[r.rank] - ladder.image_bytes[r.rank]
                                                   - r.state_bytes) if ladder else 0)
                   for r in prediction.ranks]
        return prediction, layouts

    # --- changing the layout (the steps are engine/control/operations.py's and recovery.py's) ----------
    def adopt(self, cut: tuple[int, ...], shape: ServingShape, prediction: PoolResult, measured: list[dict]) -> None:
        """Make a layout the ranks built and that verified against `prediction` the current one: the scheduler starts
        afresh over its pools and takes the waiting requests over (refusing, saying why, any the new shape cannot
        hold). Takes the lock; only ever called with no sequence holding blocks."""
        with self.lock:
            self._cut, self._shape, self._prediction, self._measured = tuple(cut), shape, prediction, measured
            self.stages.clear()
            self.latency.clear()
            blocks = BlockManager((prediction.pool_tokens or 0) // shape.block_size, shape.block_size,
                                  tracks_kv=bool(self.census.attention_layers))
            slots = SlotManager(shape.max_num_seqs)
            old = getattr(self, "scheduler", None)  # none yet at start-up
            self.scheduler = Scheduler(blocks, slots, max_num_seqs=shape.max_num_seqs,
                                       max_num_batched_tokens=shape.max_num_batched_tokens,
                                       max_model_len=shape.max_model_len, eos_token_ids=self.eos_ids,
                                       deterministic=self.deterministic)
            if old is not None:
                self.scheduler.preemptions = old.preemptions
                for seq in old.waiting:
                    self._requeue(seq)

    def drain(self, failing: Iterable[Sequence] = (), why: str = "") -> int:
        """Every running request back to the queue, in order, to be recomputed after the change; those of `failing`
        still running end with an error saying `why` instead. Returns how many failed."""
        with self.lock:
            failed = [seq for seq in failing if seq in self.scheduler.running]
            for seq in failed:
                self._fail(seq, why)
            for seq in reversed(list(self.scheduler.running)):
                self.scheduler.preempt(seq)
        return len(failed)

    def trial_step(self) -> None:
        """One token through every rank, in a scratch slot and block that no sequence holds (they are taken from the
        scheduler for the step); raises unless the pipeline really computes."""
        scheduler = self.scheduler
        with self.lock:
            blocks = scheduler.blocks.allocate(scheduler.blocks.blocks_for(1))
            slot = scheduler.slots.allocate()
        try:
            plan = StepPlan([0], [1], [0], [slot], [blocks], self.shape.block_size, [0])
            self.ranks.call_all("step", [plan] * self.rig.size)
        finally:
            with self.lock:
                scheduler.blocks.release(blocks)
                scheduler.slots.release(slot)

    def set_phase(self, phase: str) -> None:
        """The phase of the operation running (pausing, draining, acting, verifying, rolling_back)."""
        self._phase = phase

    def resume(self) -> None:
        """An operation is done: serving again, unless it left the engine broken."""
        if self._phase != "broken":
            self._phase = "serving"
        self.wake.set()

    def mark_broken(self, reason: str) -> None:
        """No verified layout could be restored: every request is refused, now and from now on, and /healthz says
        why."""
        self.step_health.broken_reason = reason
        self._phase = "broken"
        self.refuse_all("the engine could not restore a verified layout after a failure")

    def _requeue(self, seq: Sequence) -> None:
        try:
            self.scheduler.add(seq)
        except EngineRequestError as error:  # the new shape cannot hold it: refused explicitly, never dropped
            self._finish(seq, "refused", str(error))

    # --- requests --------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.text.encode(text)

    def max_prompt_chars(self) -> int | None:
        return self.text.max_prompt_chars(self.max_model_len)

    def decode(self, token_ids: list[int]) -> str:
        return self.text.decode(token_ids)

    def submit(self, prompt: list[int] | str, params: SamplingParams) -> RequestHandle:
        if self.phase == "broken":
            raise EngineRequestError("the engine could not restore a verified layout after a failure: restart it")
        ids = self.text.prompt_ids(prompt)
        with self.lock:
            seq = Sequence(next(self.ids), ids, params)
            self.scheduler.add(seq)  # refuses, naming why, a request that can never fit
            self.latency.submitted(seq.seq_id)
            self.metrics.submitted(seq.seq_id, len(ids))
            handle = self.handles[seq.seq_id] = RequestHandle(seq.seq_id, ids, logprobs=seq.logprobs)
        self.wake.set()
        return handle

    def cancel(self, request_id: int, reason: str = "cancelled") -> None:
        """The request is dropped at the next step boundary and ends with `reason`: `cancelled` when the client went
        away, `stop` when the service matched one of its stop strings (the engine cannot: it sees no text)."""
        with self.lock:
            self.cancelled[request_id] = reason
        self.wake.set()

    def _drop_cancelled(self) -> None:
        with self.lock:
            for request_id, reason in self.cancelled.items():
                seq = self.scheduler.abort(request_id)
                if seq is not None:
                    self._finish(seq, reason)
            self.cancelled.clear()

    def refuse_all(self, why: str) -> None:
        """Nothing is silently lost: every queued or running request is refused, saying why."""
        with self.lock:
            for seq in [*self.scheduler.running, *self.scheduler.waiting]:
                self._finish(seq, "refused", why)
            self.scheduler.running.clear()
            self.scheduler.waiting.clear()

    def _fail(self, seq: Sequence, why: str) -> None:
        """This request alone ends with an error (its client is told why); the engine goes on serving the rest."""
        log.warning("request %d failed: %s", seq.seq_id, why)
        self.scheduler.abort(seq.seq_id)
        self._finish(seq, "error", why)

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        handle = self.handles.pop(seq.seq_id, None)
        self.sampler.release(seq.seq_id)
        self.latency.finished(seq.seq_id, reason)
        self.metrics.finished(seq.seq_id, reason)
        if handle is not None:
            handle.end(reason, error)

    # --- the engine loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop:
            began = time.perf_counter()  # a step's host time counts from here (stage_timer.StageLog, host_ms)
            if self.cancelled:
                self._drop_cancelled()
            if self.ops.pending():
                self.ops.run_next()
                continue
            with self.lock:
                batch = self.scheduler.schedule()
            if batch is None:
                self.wake.wait(0.05)
                self.wake.clear()
                continue
            try:
                self._step(batch, began)
            except Exception as error:  # a failed step requeues its requests and restores the layout
                log.exception("step failed: %s", error)
                self.ops.recover(error, batch)

    def _step(self, batch: Batch, began: float) -> None:
        """`began`: when the loop's iteration that scheduled `batch` started."""
        plan = batch.plan(self.shape.block_size)
        token_ids = plan.token_ids
        self.metrics.scheduled(seq.seq_id for seq in batch.seqs)
        sent = time.perf_counter()
        replies = self.ranks.call_all("step", [plan] * self.rig.size)
        ranks_s = time.perf_counter() - sent  # sending the plan, the ranks' stages, receiving the logits
        for rank, (_, memory, _) in enumerate(replies):
            if memory is not None:
                self.device_memory[rank] = memory
        logits = replies[-1][0]
        ready = [i for i in range(len(batch.seqs)) if batch.completes_prompt(i)]
        # A request whose sampling raises fails alone: the ranks did their part, so the step stands for the others.
        drawn = self.sampler.sample_rows(logits, [batch.seqs[i] for i in ready])
        decode = sum(1 for i in ready if batch.cached_lens[i] > 0 and batch.query_lens[i] == 1)
        with self.lock:  # state() reads the stage log from the HTTP threads
            self.step_health.step_succeeded()
            self.metrics.stage_times(len(token_ids) - decode, [stage_ms for _, _, stage_ms in replies])
            tokens = {batch.seqs[i].seq_id: token for i, token in zip(ready, drawn, strict=True)
                      if not isinstance(token, Exception)}
            finished = self.scheduler.commit(batch, tokens)
            self.latency.emitted(tokens)
            self.metrics.emitted(tokens)
            for i, token in zip(ready, drawn, strict=True):
                if isinstance(token, Exception):
                    self._fail(batch.seqs[i], f"sampling failed: {type(token).__name__}: {token}")
            for seq_id, token in tokens.items():
                handle = self.handles.get(seq_id)
                if handle is not None:
                    handle.emit(token)
            for seq in finished:
                self._finish(seq, seq.finish_reason or "length")
            # Host time: the iteration's wall time outside the ranks' round trip; the sampler's work on the logits
            # counts, as it runs in this process. Recorded last, so it covers the commit and the emits above.
            host_ms = (time.perf_counter() - began - ranks_s) * 1e3
            self.stages.add(len(token_ids) - decode, decode, [stage_ms for _, _, stage_ms in replies], host_ms)
        self._throughput.append((time.monotonic(), len(token_ids) - decode, decode))

    # --- reading the engine ----------------------------------------------------------------------
    def token_rates(self) -> tuple[float, float]:
        """Prefill and decode tokens per second over the last THROUGHPUT_WINDOW_S of steps."""
        now = time.monotonic()
        while self._throughput and self._throughput[0][0] < now - THROUGHPUT_WINDOW_S:
            self._throughput.popleft()
        prefill = sum(item[1] for item in self._throughput)
        decode = sum(item[2] for item in self._throughput)
        return prefill / THROUGHPUT_WINDOW_S, decode / THROUGHPUT_WINDOW_S

    def fingerprint(self) -> str:
        return layout_fingerprint(self.cut, self.shape)

    def state(self) -> EngineState:
        with self.lock:
            return build_state(self)

    def health(self) -> Health:
        """GET /healthz: not ok while broken or in a recovery loop.
        Takes no lock, so it answers even while a step or an operation is stuck."""
        return self.step_health.report(self.phase)

    def snapshot(self, advance: bool = False) -> Snapshot:
        """The current snapshot; only the publisher advances `seq`, so a scrape never leaves a gap."""
        with self.lock:
            if advance:
                self.last_seq = next(self.snapshot_seq)
            return build_snapshot(self, self.last_seq)

    def plan(self, body: dict) -> PlanReply:
        return self.ops.plan(body)

    def apply(self, plan: dict, plan_hash: str, job_id: int | None = None) -> str:
        operation_id = self.ops.apply(plan, plan_hash, job_id)
        self.wake.set()  # the loop runs it at the next step boundary
        return operation_id

    def operation(self, operation_id: str) -> Operation | None:
        return self.ops.get(operation_id)

    def operations(self) -> list[Operation]:
        return self.ops.list()

    def find_operations(self, plan_hash: str) -> list[Operation]:
        return self.ops.find(plan_hash)

    def shutdown(self) -> None:
        self._stop = True
        if getattr(self, "loop", None) is not None and self.loop is not threading.current_thread():
            self.loop.join(timeout=10)
        if getattr(self, "ranks", None) is not None:
            self.ranks.stop()
        with self.lock:
            for seq_id in list(self.handles):
                self.handles.pop(seq_id).end("refused", "the engine shut down")
