"""What the driver's helpers in this package may use of it: operations and recovery act through `Reconfigurable`, the
state replies read through `Observable`. The driver (engine/control/driver.py) satisfies both and hands itself over;
this module never imports it, so the package's imports point one way: driver -> operations -> recovery -> surface,
driver -> snapshot -> surface.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Protocol

from contracts.control import Health
from contracts.layout import ServingShape
from engine.control.health import StepHealth
from engine.memory.host_image import HostImage
from engine.ranks.group import RankGroup
from engine.ranks.rank import RankLayout
from engine.runtime.scheduler import Scheduler
from engine.runtime.sequence import Sequence
from engine.telemetry.latency import LatencyLog
from engine.telemetry.stage_timer import StageLog
from solvers.capacity import PoolResult
from solvers.census import ModelCensus
from solvers.ladder import Ladder
from solvers.rig import Rig


class Serving(Protocol):
    """The layout being served and how it is priced."""

    @property
    def lock(self) -> threading.RLock:
        """Held for every read of the scheduler or the layout that must not see a change half made."""
        ...

    @property
    def rig(self) -> Rig: ...

    @property
    def census(self) -> ModelCensus: ...

    @property
    def rungs(self) -> list[tuple[int, ...]]:
        """The armed ladder's cuts; empty when none is armed."""
        ...

    @property
    def cut(self) -> tuple[int, ...]: ...

    @property
    def shape(self) -> ServingShape: ...

    @property
    def phase(self) -> str:
        """starting | serving | broken, or the phase of the operation running."""
        ...

    def ladder(self, shape: ServingShape | None = None) -> Ladder | None: ...

    def fingerprint(self) -> str: ...


class Reconfigurable(Serving, Protocol):
    """What a reconfiguration or a recovery does to the driver, on the engine loop's thread between steps."""

    @property
    def image(self) -> HostImage: ...

    @property
    def ranks(self) -> RankGroup: ...

    @property
    def step_health(self) -> StepHealth: ...

    def layouts(self, cut: tuple[int, ...], shape: ServingShape) -> tuple[PoolResult, list[RankLayout]]:
        """The planner's prediction for `cut` at `shape` and each rank's layout from it (EngineError if refused)."""
        ...

    def drain(self, failing: Iterable[Sequence] = (), why: str = "") -> int:
        """Every running request back to the queue, after failing those of `failing` still running; how many failed."""
        ...

    def adopt(self, cut: tuple[int, ...], shape: ServingShape, prediction: PoolResult, measured: list[dict]) -> None:
        """Make a built and verified layout the current one."""
        ...

    def trial_step(self) -> None:
        """One token through every rank; raises unless the pipeline really computes."""
        ...

    def set_phase(self, phase: str) -> None: ...

    def resume(self) -> None:
        """Serving again after an operation (a broken engine stays broken)."""
        ...

    def mark_broken(self, reason: str) -> None:
        """No verified layout could be restored: every request is refused from now on."""
        ...


class Observable(Serving, Protocol):
    """What GET /control/state and the telemetry snapshot read of the driver, under its lock."""

    model_name: str
    boot_id: str
    notes: list[str]

    @property
    def prediction(self) -> PoolResult: ...

    @property
    def measured(self) -> list[dict]:
        """Each rank's figures for the layout it serves, as its build reported them."""
        ...

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def stages(self) -> StageLog: ...

    @property
    def latency(self) -> LatencyLog: ...

    @property
    def device_memory(self) -> dict[int, dict]: ...

    def token_rates(self) -> tuple[float, float]:
        """Prefill and decode tokens per second over the last few seconds of steps."""
        ...

    def health(self) -> Health: ...
