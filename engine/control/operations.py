"""Live reconfiguration: plan -> validate -> pause at a step boundary -> drain -> act -> verify -> resume,
or restore the previous layout, verify it, and report `rolled_back` with both figures (docs/domain.md §10).

Operations run on the engine loop's thread between steps, one at a time. In-flight requests are
preempted and requeued (recompute), never dropped; greedy outputs are the same as without the change.
A failed step is recovered the same way, as a `recovery` operation (engine/control/recovery.py restores the layout,
engine/control/health.py caps a loop of them). The newest KEEP_FINISHED finished operations are kept. The driver is
reached through engine/control/surface.py's `Reconfigurable` only.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace

from contracts.control import LayoutFigures, Operation, OperationStatus
from contracts.errors import ContractError
from contracts.layout import ServingShape
from contracts.plan import PlanReply, PlanRequest, verify_plan
from engine.control.protocol import ApplyRefused
from engine.control.recovery import restore, verify
from engine.control.surface import Reconfigurable
from engine.errors import EngineError
from engine.runtime.scheduler import Batch
from engine.telemetry.metrics import EngineMetrics
from solvers.errors import SolverError
from solvers.ladder import switch_cost_s
from solvers.plans import build_plan

log = logging.getLogger("seam.engine")
KEEP_FINISHED = 256  # finished operations kept for GET /control/operations; queued and running ones always are
PROGRESS = {"queued": 0.0, "pausing": 0.1, "draining": 0.2, "acting": 0.4, "verifying": 0.8, "rolling_back": 0.9,
            "done": 1.0}


@dataclass
class OperationRecord:
    """The engine's own, changing record of one operation; `reply()` is what the control API shows of it."""

    id: str
    kind: str
    target: dict
    plan_hash: str
    status: OperationStatus = OperationStatus.QUEUED
    phase: str = "queued"
    predicted: LayoutFigures | None = None
    measured: LayoutFigures | None = None
    previous: LayoutFigures | None = None  # the layout restored by a rollback, as measured after restoring it
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    job_id: int | None = None  # the console job whose attested review let the plan through
    started: float = field(default_factory=time.time)
    finished: float | None = None

    @property
    def progress(self) -> float:
        return PROGRESS.get(self.phase, 0.0)

    def reply(self) -> Operation:
        return Operation(id=self.id, kind=self.kind, target=self.target, plan_hash=self.plan_hash, status=self.status,
                         phase=self.phase, progress=self.progress, predicted=self.predicted, measured=self.measured,
                         previous=self.previous, error=self.error, notes=tuple(self.notes), job_id=self.job_id,
                         started=self.started, finished=self.finished)


def measured_figures(measured: list[dict]) -> LayoutFigures:
    """The pool a pipeline really holds is the smallest pool among ranks that hold attention layers."""
    holding = [m for m in measured if m["attention_layers"]]
    binder = min(holding, key=lambda m: (m["kv_pool_tokens"], m["rank"])) if holding else None
    switches = [m["switch_s"] for m in measured if m.get("switch_s") is not None]
    return LayoutFigures(pool_tokens=binder["kv_pool_tokens"] if binder else None,
                         binding_rank=binder["rank"] if binder else None, ranks=tuple(measured),
                         # ranks refill in parallel: the slowest sets the switch time
                         switch_s=max(switches) if switches else None)


def host_ram_available() -> int | None:
    """MemAvailable from /proc/meminfo, or None when it cannot be read (the check then stands down)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class Operations:
    def __init__(self, driver: Reconfigurable, metrics: EngineMetrics):
        self.driver = driver
        self.metrics = metrics  # counts each operation's outcome as it finishes
        self.items: dict[str, OperationRecord] = {}
        self.queue: deque[tuple[OperationRecord, tuple[int, ...], ServingShape]] = deque()
        self.counter = itertools.count(1)

    # --- the control API -------------------------------------------------------------------------
    def plan(self, body: dict) -> PlanReply:
        driver = self.driver
        request = PlanRequest.from_dict(body, ranks=driver.rig.size, num_layers=driver.census.num_layers)
        self._target(request)  # a kind this engine cannot apply is refused now, not after a review
        return build_plan(request, driver.census, driver.rig, driver.cut, driver.shape, ladder=driver.ladder())

    def apply(self, plan: dict, plan_hash: str, job_id: int | None = None) -> str:
        driver = self.driver
        try:
            verify_plan(plan, plan_hash)
            request = PlanRequest.from_dict({key: plan.get(key) for key in ("kind", "target", "incumbent_fingerprint")},
                                            ranks=driver.rig.size, num_layers=driver.census.num_layers)
        except ContractError as error:
            raise ApplyRefused(400, str(error)) from error
        with driver.lock:
            if driver.phase == "broken":
                raise ApplyRefused(409, "the engine could not restore a verified layout after a failure: restart it")
            if self.queue or driver.phase != "serving":
                raise ApplyRefused(409, "another operation is in progress; operations run one at a time")
            current = driver.fingerprint()
            if request.incumbent_fingerprint != current:
                raise ApplyRefused(409, f"the plan was made for layout {request.incumbent_fingerprint}; the engine "
                                        f"now runs {current}: plan again")
            try:
                fresh = build_plan(request, driver.census, driver.rig, driver.cut, driver.shape, ladder=driver.ladder())
            except (ContractError, SolverError) as error:
                raise ApplyRefused(422, str(error)) from error
            if not fresh.feasible:
                raise ApplyRefused(422, "the plan is infeasible: " + "; ".join(fresh.reasons))
            cut, shape = self._target(request)
            op = OperationRecord(f"op-{next(self.counter)}-{uuid.uuid4().hex[:8]}", request.kind, request.target,
                           plan_hash.lower(), job_id=job_id)
            self.record(op)
            self.queue.append((op, cut, shape))
        return op.id

    def _target(self, request) -> tuple[tuple[int, ...], ServingShape]:
        driver = self.driver
        if request.kind == "shape":
            return driver.cut, ServingShape.from_dict({**driver.shape.to_dict(), **request.target})
        if request.kind == "cut" and not driver.rungs:
            return tuple(request.target["cut"]), driver.shape
        if request.kind == "cut":
            raise ApplyRefused(422, "a ladder is armed: move between its rungs with a ladder plan")
        if not driver.rungs:
            raise ApplyRefused(422, "no layout ladder is armed on this engine: start it with --ladder to move on one")
        return tuple(request.target["rung"]), driver.shape

    def get(self, operation_id: str) -> Operation | None:
        op = self.items.get(operation_id)
        return None if op is None else op.reply()

    def list(self) -> list[Operation]:
        return [op.reply() for op in self._held()]

    def find(self, plan_hash: str) -> list[Operation]:
        """The operations started for `plan_hash`, oldest first: how a console that lost an operation id finds it."""
        return [op.reply() for op in self._held() if op.plan_hash == plan_hash.lower()]

    def _held(self) -> list[OperationRecord]:
        with self.driver.lock:  # the engine loop adds and prunes records meanwhile
            return list(self.items.values())

    def record(self, op: OperationRecord) -> None:
        """Hold `op`; beyond KEEP_FINISHED finished operations the oldest go (a failure loop once piled up 2,059)."""
        with self.driver.lock:
            self.items[op.id] = op
            finished = [key for key, held in self.items.items() if held.status.done]
            for key in finished[:-KEEP_FINISHED]:
                del self.items[key]

    def pending(self) -> bool:
        return bool(self.queue)

    # --- executing, on the engine loop's thread --------------------------------------------------
    def run_next(self) -> None:
        op, cut, shape = self.queue.popleft()
        driver = self.driver
        old_cut, old_shape = driver.cut, driver.shape
        op.status = OperationStatus.RUNNING
        try:
            self._phase(op, "pausing")  # the loop is between steps: nothing is mid-flight now
            self._phase(op, "draining")
            driver.drain()  # requeued in order; recomputed after the change
            prediction, layouts = driver.layouts(cut, shape)
            op.predicted = LayoutFigures(prediction.pool_tokens, prediction.binding_rank, tuple(prediction.table()))
            ladder = driver.ladder(shape)
            if ladder is not None:
                op.predicted = replace(op.predicted, switch_cost_s=switch_cost_s(ladder, cut))
            self._check_host_ram(op, cut)
            self._phase(op, "acting")
            measured = driver.ranks.call_all("build", layouts)
            op.measured = measured_figures(measured)
            self._phase(op, "verifying")
            problems = verify(prediction, measured)
            if problems:
                raise EngineError("verification missed the prediction: " + "; ".join(problems))
            driver.adopt(cut, shape, prediction, measured)
            driver.trial_step()  # the new layout computes, through every rank
            op.status = OperationStatus.SUCCEEDED
        except Exception as error:  # any failure restores the previous layout; none may end the loop
            named = isinstance(error, EngineError | SolverError | ContractError)  # their messages say what failed
            op.error = str(error) if named else f"{type(error).__name__}: {error}"
            log.warning("operation %s: %s; restoring %s", op.id, error, list(old_cut))
            try:
                self._restore(op, old_cut, old_shape, restart=getattr(error, "restart", False))
            except Exception:
                log.exception("operation %s: restoring %s failed; the engine is broken", op.id, list(old_cut))
        finally:
            op.phase, op.finished = "done", time.time()
            self.metrics.operation_finished(op.kind, op.status.value)
            driver.resume()

    def _phase(self, op: OperationRecord, phase: str) -> None:
        op.phase = phase
        self.driver.set_phase(phase)

    def _check_host_ram(self, op: OperationRecord, cut: tuple[int, ...]) -> None:
        driver = self.driver
        gained = 0
        for rank in range(driver.rig.size):
            new = set(range(sum(cut[:rank]), sum(cut[:rank + 1])))
            old = set(range(sum(driver.cut[:rank]), sum(driver.cut[:rank + 1])))
            gained += sum(driver.image.layer_bytes(range(i, i + 1)) for i in new - old)
        available = host_ram_available()
        if available is None:
            op.notes.append("host RAM could not be read (/proc/meminfo): the host RAM check stood down")
        elif gained > available:
            raise EngineError(f"host RAM check: the ranks would copy {gained} B of layers from the host image but "
                              f"only {available} B are available")
        else:
            op.notes.append(f"host RAM check: {gained} B to copy, {available} B available")

    def _restore(self, op: OperationRecord, cut: tuple[int, ...], shape: ServingShape, restart: bool = False) -> None:
        """Back to the previous verified layout; `rolled_back` only if it verifies and steps again, else `failed`
        and the engine is broken. A dead or stalled rank, or a failed transfer, breaks the whole process group:
        then (`restart`) every rank process is replaced first."""
        driver = self.driver
        self._phase(op, "rolling_back")
        restarts = driver.ranks.restarts
        try:
            op.previous = measured_figures(restore(driver, cut, shape, restart))
            op.status = OperationStatus.ROLLED_BACK if op.predicted is not None else OperationStatus.FAILED
        except Exception as error:
            op.status = OperationStatus.FAILED
            op.error = f"{op.error}; restoring the previous layout failed too: {error}"
            driver.mark_broken(op.error)
            raise
        finally:
            if driver.ranks.restarts > restarts:
                op.notes.append("every rank process was replaced: the process group could not be trusted")

    def recover(self, error: Exception, batch: Batch) -> None:
        """A step failed (a rank died, stalled or erred): requeue its requests and restore the current layout.

        When steps have failed MAX_RECOVERIES_IN_A_ROW times with none succeeding between (engine/control/health.py),
        the
        failing batch's requests are refused, saying why, instead of requeued: no request can loop the engine."""
        driver = self.driver
        looping = driver.step_health.step_failed(error)
        restart = getattr(error, "restart", False)
        op = OperationRecord(f"recovery-{next(self.counter)}", "recovery", {"cut": list(driver.cut)}, "",
                             OperationStatus.RUNNING)
        op.error = str(error)
        refused = driver.drain(batch.seqs if looping else (),
                               f"the engine failed {driver.step_health.recoveries_in_a_row} steps in a row, the last "
                               f"with this request; it is refused rather than retried: {error}")
        if looping:
            op.notes.append(f"a recovery loop: {refused} requests of the failing batch were refused")
        self.record(op)
        try:
            self._restore(op, driver.cut, driver.shape, restart=restart)
            op.status = OperationStatus.SUCCEEDED  # the running layout was restored, verified and stepped again
        except Exception:
            log.exception("recovery failed; the engine is broken")
        finally:
            op.phase, op.finished = "done", time.time()
            self.metrics.operation_finished(op.kind, op.status.value)
            driver.resume()
