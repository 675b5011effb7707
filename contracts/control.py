"""The engine's control API replies (engine/serve/http.py sends them; the console's engine port parses them):

    GET  /control/state                  -> EngineState
    POST /control/plan                   -> PlanReply (contracts/plan.py)
    POST /control/apply                  -> Accepted (202)
    GET  /control/operations?plan_hash=  -> OperationList
    GET  /control/operations/{id}        -> Operation
    GET  /control/audit-head?trail=      -> Witnessed
    GET  /healthz                        -> Health
    any refusal (4xx, 5xx)               -> Refusal

The engine builds these types and writes them with `to_dict`; the console reads them with `from_dict`, which keeps
the fields an older engine may leave out optional (None, or empty) and names the first field that does not parse.
`to_dict` always writes every field, so what the engine sends is exactly what it sent before these types existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from contracts.errors import ContractError
from contracts.layout import Cut, ServingShape
from contracts.measurement import LayoutMeasurement
from contracts.reading import count, field, flag, mapping, number, obj, path, text, texts

__all__ = ["Accepted", "EngineState", "Health", "LadderState", "LayoutFigures", "Operation", "OperationList",
           "OperationStatus", "Refusal", "Witnessed", "WitnessedHead"]


class OperationStatus(StrEnum):
    """Where an operation is: queued, running, then one of the three endings (`done`)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"

    @property
    def done(self) -> bool:
        """Ended: the engine will not change this operation again."""
        return self in (OperationStatus.SUCCEEDED, OperationStatus.FAILED, OperationStatus.ROLLED_BACK)

    @classmethod
    def parse(cls, value: Any, where: str) -> OperationStatus:
        try:
            return cls(value)
        except ValueError:
            raise ContractError(f"{where}: expected one of {', '.join(cls)}, got {value!r:.40}") from None


@dataclass(frozen=True)
class LayoutFigures:
    """An operation's figures of one layout: its pool (the binding rank's, None without attention layers), the rank
    that binds it, and per rank the planner's table row (predicted) or the rank's build report (measured, previous),
    carried as they came; `switch_cost_s` the predicted and `switch_s` the measured time of a ladder switch."""

    pool_tokens: int | None
    binding_rank: int | None
    ranks: tuple[dict[str, Any], ...]
    switch_cost_s: float | None = None
    switch_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        figures: dict[str, Any] = {"pool_tokens": self.pool_tokens, "binding_rank": self.binding_rank,
                                   "ranks": [dict(row) for row in self.ranks]}
        if self.switch_cost_s is not None:
            figures["switch_cost_s"] = self.switch_cost_s
        if self.switch_s is not None:
            figures["switch_s"] = self.switch_s
        return figures

    @classmethod
    def from_dict(cls, data: Any, where: str) -> LayoutFigures:
        ranks = field(data, "ranks", where)
        if not isinstance(ranks, list) or not all(isinstance(row, dict) for row in ranks):
            raise ContractError(f"{path(where, 'ranks')}: expected one object per rank")
        return cls(pool_tokens=count(field(data, "pool_tokens", where), path(where, "pool_tokens"), allow_none=True),
                   binding_rank=count(field(data, "binding_rank", where), path(where, "binding_rank"),
                                      allow_none=True),
                   ranks=tuple(dict(row) for row in ranks),
                   switch_cost_s=number(data.get("switch_cost_s"), path(where, "switch_cost_s"), allow_none=True),
                   switch_s=number(data.get("switch_s"), path(where, "switch_s"), allow_none=True))


def _dict_of(figures: LayoutFigures | None) -> dict[str, Any] | None:
    return None if figures is None else figures.to_dict()


def _figures(data: Any, name: str, where: str, *, required: bool) -> LayoutFigures | None:
    value = field(data, name, where) if required else data.get(name)
    return None if value is None else LayoutFigures.from_dict(value, path(where, name))


@dataclass(frozen=True)
class Operation:
    """One reconfiguration (or recovery) the engine ran or runs. `predicted`, `measured` and `previous` are the figures
    of the plan, of the layout built, and of the layout a rollback restored; `job_id` is the console job whose attested
    review started it."""

    id: str
    status: OperationStatus
    phase: str
    progress: float
    predicted: LayoutFigures | None
    measured: LayoutFigures | None
    error: str | None
    kind: str | None = None  # cut | shape | ladder | recovery
    target: dict[str, Any] | None = None
    plan_hash: str | None = None  # "" for a recovery
    previous: LayoutFigures | None = None
    notes: tuple[str, ...] = ()
    job_id: int | None = None
    started: float | None = None
    finished: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "target": self.target, "plan_hash": self.plan_hash,
                "status": self.status.value, "phase": self.phase, "progress": self.progress,
                "predicted": _dict_of(self.predicted), "measured": _dict_of(self.measured),
                "previous": _dict_of(self.previous),
                "error": self.error, "notes": list(self.notes), "job_id": self.job_id, "started": self.started,
                "finished": self.finished}

    @classmethod
    def from_dict(cls, data: Any, where: str = "operation") -> Operation:
        obj(data, where)

        def at(name: str) -> str:
            return path(where, name)

        job_id = data.get("job_id")
        if job_id is not None and (isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1):
            raise ContractError(f"{at('job_id')}: expected a positive integer or null, got {job_id!r:.40}")
        return cls(id=text(field(data, "id", where), at("id"), allow_empty=False),
                   status=OperationStatus.parse(field(data, "status", where), at("status")),
                   phase=text(field(data, "phase", where), at("phase")),
                   progress=number(field(data, "progress", where), at("progress")),
                   predicted=_figures(data, "predicted", where, required=True),
                   measured=_figures(data, "measured", where, required=True),
                   error=text(field(data, "error", where), at("error"), allow_none=True),
                   kind=text(data.get("kind"), at("kind"), allow_none=True),
                   target=mapping(data.get("target"), at("target"), allow_none=True),
                   plan_hash=text(data.get("plan_hash"), at("plan_hash"), allow_none=True),
                   previous=_figures(data, "previous", where, required=False),
                   notes=texts(data.get("notes") or [], at("notes")), job_id=job_id,
                   started=number(data.get("started"), at("started"), allow_none=True),
                   finished=number(data.get("finished"), at("finished"), allow_none=True))


@dataclass(frozen=True)
class Health:
    """GET /healthz, and the state's `health`: `ok` is false while the engine is broken or caught in a recovery loop
    (engine/control/health.py), `reason` then says which."""

    ok: bool
    phase: str
    reason: str | None
    recoveries_in_a_row: int
    recoveries: int
    last_error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "phase": self.phase, "reason": self.reason,
                "recoveries_in_a_row": self.recoveries_in_a_row, "recoveries": self.recoveries,
                "last_error": self.last_error}

    @classmethod
    def from_dict(cls, data: Any, where: str = "health") -> Health:
        def at(name: str) -> str:
            return path(where, name)

        return cls(ok=flag(field(data, "ok", where), at("ok")), phase=text(field(data, "phase", where), at("phase")),
                   reason=text(field(data, "reason", where), at("reason"), allow_none=True),
                   recoveries_in_a_row=count(field(data, "recoveries_in_a_row", where), at("recoveries_in_a_row")),
                   recoveries=count(field(data, "recoveries", where), at("recoveries")),
                   last_error=text(field(data, "last_error", where), at("last_error"), allow_none=True))


@dataclass(frozen=True)
class LadderState:
    """The state's `ladder`: whether a layout ladder is armed and, when it is, its rungs, the one served, the
    predicted switch cost, each rank's pinned image and arena, and each rung's pool (keyed "8,4,4")."""

    armed: bool
    rungs: tuple[Cut, ...] = ()
    current: Cut | None = None
    switch_cost_s: float | None = None
    image_bytes: tuple[int, ...] = ()
    pinned_bytes: tuple[int, ...] = ()
    pool_tokens: dict[str, int | None] | None = None  # on the wire: `pools`

    def to_dict(self) -> dict[str, Any]:
        if not self.armed:
            return {"armed": False}
        return {"armed": True, "rungs": [rung.to_list() for rung in self.rungs],
                "current": None if self.current is None else self.current.to_list(),
                "switch_cost_s": self.switch_cost_s, "image_bytes": list(self.image_bytes),
                "pinned_bytes": list(self.pinned_bytes), "pools": dict(self.pool_tokens or {})}

    @classmethod
    def from_dict(cls, data: Any, where: str = "ladder") -> LadderState:
        def at(name: str) -> str:
            return path(where, name)

        if not flag(field(data, "armed", where), at("armed")):
            return cls(armed=False)
        rungs = field(data, "rungs", where)
        if not isinstance(rungs, list):
            raise ContractError(f"{at('rungs')}: expected a list of cuts, got {type(rungs).__name__}")
        pools = obj(field(data, "pools", where), at("pools"))
        byte_lists = {}
        for name in ("image_bytes", "pinned_bytes"):
            values = field(data, name, where)
            if not isinstance(values, list):
                raise ContractError(f"{at(name)}: expected bytes per rank, got {type(values).__name__}")
            byte_lists[name] = tuple(count(v, f"{at(name)}[{i}]") for i, v in enumerate(values))
        return cls(armed=True, rungs=tuple(Cut.parse(rung, f"{at('rungs')}[{i}]") for i, rung in enumerate(rungs)),
                   current=Cut.parse(field(data, "current", where), at("current")),
                   switch_cost_s=number(field(data, "switch_cost_s", where), at("switch_cost_s")),
                   pool_tokens={str(key): count(value, f"{at('pools')}.{key}", allow_none=True)
                                for key, value in pools.items()}, **byte_lists)


@dataclass(frozen=True)
class EngineState:
    """GET /control/state: the layout the engine serves (fingerprint, cut, shape), its phase and pool, the planner's
    per-rank table with each rank's build report (`ranks`, carried as it came), the ladder, and the engine's own
    measurement of the layout and health.

    `boot_id` is fresh at every start of the engine: another one means it restarted (and lost its operations). The
    measurement is the engine's report on itself: a state whose measurement does not parse is still a state (the
    layout is what the console acts on), so `from_dict` keeps why in `measurement_error` instead of refusing it."""

    fingerprint: str
    cut: Cut
    shape: ServingShape
    phase: str
    model: str | None = None
    rig: str | None = None
    boot_id: str | None = None
    pool_tokens: int | None = None
    binding_rank: int | None = None
    ranks: tuple[dict[str, Any], ...] = ()
    ladder: LadderState | None = None
    notes: tuple[str, ...] = ()
    measurement: LayoutMeasurement | None = None
    health: Health | None = None
    measurement_error: str | None = None  # parsing only: why `measurement` is None although one was sent

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "rig": self.rig, "boot_id": self.boot_id, "fingerprint": self.fingerprint,
                "cut": self.cut.to_list(), "shape": self.shape.to_dict(), "phase": self.phase,
                "pool_tokens": self.pool_tokens, "binding_rank": self.binding_rank,
                "ranks": [dict(row) for row in self.ranks],
                "ladder": None if self.ladder is None else self.ladder.to_dict(), "notes": list(self.notes),
                "measurement": None if self.measurement is None else self.measurement.to_dict(),
                "health": None if self.health is None else self.health.to_dict()}

    def layout(self) -> dict[str, Any]:
        """{fingerprint, cut, shape} as JSON: the layout as the console records it."""
        return {"fingerprint": self.fingerprint, "cut": self.cut.to_list(), "shape": self.shape.to_dict()}

    @classmethod
    def from_dict(cls, data: Any, where: str = "") -> EngineState:
        def at(name: str) -> str:
            return path(where, name)

        obj(data, where)
        ranks = data.get("ranks") or []
        if not isinstance(ranks, list) or not all(isinstance(row, dict) for row in ranks):
            raise ContractError(f"{at('ranks')}: expected one object per rank")
        measurement, measurement_error = None, None
        if data.get("measurement") is not None:
            try:
                measurement = LayoutMeasurement.from_dict(data["measurement"], at("measurement"))
            except ContractError as error:
                measurement_error = str(error)
        binding_rank = data.get("binding_rank")
        return cls(fingerprint=text(field(data, "fingerprint", where), at("fingerprint"), allow_empty=False),
                   cut=Cut.parse(field(data, "cut", where), at("cut")),
                   shape=ServingShape.from_dict(field(data, "shape", where), at("shape")),
                   phase=text(field(data, "phase", where), at("phase")),
                   model=text(data.get("model"), at("model"), allow_none=True),
                   rig=text(data.get("rig"), at("rig"), allow_none=True),
                   boot_id=text(data.get("boot_id"), at("boot_id"), allow_none=True),
                   pool_tokens=count(data.get("pool_tokens"), at("pool_tokens"), allow_none=True),
                   binding_rank=count(binding_rank, at("binding_rank"), allow_none=True),
                   ranks=tuple(dict(row) for row in ranks),
                   ladder=None if data.get("ladder") is None else LadderState.from_dict(data["ladder"], at("ladder")),
                   notes=texts(data.get("notes") or [], at("notes")),
                   measurement=measurement, measurement_error=measurement_error,
                   health=None if data.get("health") is None else Health.from_dict(data["health"], at("health")))


@dataclass(frozen=True)
class WitnessedHead:
    """GET /control/audit-head?trail=: the newest audit head of a console's trail that the engine's attestations
    carried (engine/control/audit_witness.py), and, once the trail was seen going back, that rollback:
    `{from_seq, to_seq, hash, issued_at, problem}`."""

    trail: str
    seq: int
    hash: str
    issued_at: float
    rolled_back: dict[str, Any] | None

    @property
    def rollback_problem(self) -> str | None:
        return None if not self.rolled_back else str(self.rolled_back.get("problem"))

    def to_dict(self) -> dict[str, Any]:
        return {"trail": self.trail, "seq": self.seq, "hash": self.hash, "issued_at": self.issued_at,
                "rolled_back": self.rolled_back}

    @classmethod
    def from_dict(cls, data: Any, where: str = "witnessed") -> WitnessedHead:
        def at(name: str) -> str:
            return path(where, name)

        return cls(trail=text(field(data, "trail", where), at("trail")),
                   seq=count(field(data, "seq", where), at("seq")),
                   hash=text(field(data, "hash", where), at("hash")),
                   issued_at=number(field(data, "issued_at", where), at("issued_at")),
                   rolled_back=mapping(field(data, "rolled_back", where), at("rolled_back"), allow_none=True))


@dataclass(frozen=True)
class Witnessed:
    """GET /control/audit-head?trail=: the engine's witnessed head of that trail, or None when it has none."""

    witnessed: WitnessedHead | None

    def to_dict(self) -> dict[str, Any]:
        return {"witnessed": None if self.witnessed is None else self.witnessed.to_dict()}

    @classmethod
    def from_dict(cls, data: Any, where: str = "") -> Witnessed:
        head = field(data, "witnessed", where)
        return cls(None if head is None else WitnessedHead.from_dict(head, path(where, "witnessed")))


@dataclass(frozen=True)
class OperationList:
    """GET /control/operations?plan_hash=: the operations started for one plan, oldest first."""

    operations: tuple[Operation, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"operations": [operation.to_dict() for operation in self.operations]}

    @classmethod
    def from_dict(cls, data: Any, where: str = "") -> OperationList:
        operations = field(data, "operations", where)
        if not isinstance(operations, list):
            raise ContractError(f"{path(where, 'operations')}: expected a list, got {type(operations).__name__}")
        return cls(tuple(Operation.from_dict(item, f"{path(where, 'operations')}[{index}]")
                         for index, item in enumerate(operations)))


@dataclass(frozen=True)
class Accepted:
    """POST /control/apply's 202: the id of the operation started for the plan."""

    operation_id: str

    def to_dict(self) -> dict[str, Any]:
        return {"operation_id": self.operation_id}

    @classmethod
    def from_dict(cls, data: Any, where: str = "") -> Accepted:
        return cls(text(field(data, "operation_id", where), path(where, "operation_id"), allow_empty=False))


@dataclass(frozen=True)
class Refusal:
    """Any refusal of the control API and the open routes: `{"error": message}` (/v1 answers in OpenAI's shape)."""

    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message}

    @classmethod
    def from_dict(cls, data: Any, where: str = "") -> Refusal:
        return cls(text(field(data, "error", where), path(where, "error"), allow_empty=False))
