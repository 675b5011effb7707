"""The plan contract (docs/architecture.md §3.2): the request an operator makes, the plan the engine prices for it,
and the hash that binds an approval to every byte of that plan.

A request is `{kind, target, incumbent_fingerprint}`; a plan is the request with what the planner `predicted`;
`plan_hash` is the sha256 of the plan's canonical JSON. Request bodies are untrusted (they arrive over HTTP), so
every refusal is a ContractError naming the field and the problem. Pricing is the planner's (solvers/plans.py).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contracts.canonical import canonical_json
from contracts.errors import ContractError
from contracts.layout import Cut, ServingShape, dtype_width
from contracts.reading import field, flag, obj, path, show, text, texts

__all__ = ["KINDS", "REQUEST_FIELDS", "SHAPE_LIMITS", "Plan", "PlanReply", "PlanRequest", "plan_hash", "verify_plan"]

KINDS = ("cut", "shape", "ladder")
REQUEST_FIELDS = ("kind", "target", "incumbent_fingerprint")
PLAN_FIELDS = (*REQUEST_FIELDS, "predicted")
# Ceilings that no real shape reaches; they keep absurd values from reaching the arithmetic.
SHAPE_LIMITS = {"max_model_len": 2**24, "max_num_seqs": 65536, "max_num_batched_tokens": 2**24, "block_size": 4096}
_FINGERPRINT = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def plan_hash(plan: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(plan).encode("ascii")).hexdigest()


def verify_plan(plan: object, plan_hash_hex: object) -> None:
    """Refuse a plan whose hash is not the one given: what was reviewed is exactly what runs."""
    if not isinstance(plan, dict):
        raise ContractError(f"plan: expected an object, got {type(plan).__name__}")
    if not isinstance(plan_hash_hex, str):
        raise ContractError(f"plan_hash: expected a hex string, got {type(plan_hash_hex).__name__}")
    actual = plan_hash(plan)
    if not hmac.compare_digest(actual, plan_hash_hex.lower()):
        raise ContractError(f"plan_hash does not match the plan: got {show(plan_hash_hex)}, the plan's canonical "
                            f"JSON hashes to {actual}; the plan changed after it was hashed")


def _fields(data: object, where: str, required: Sequence[str], allowed: Sequence[str]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ContractError(f"{where}: expected an object, got {type(data).__name__}")
    unknown = [key for key in data if key not in allowed]
    if unknown:
        raise ContractError(f"{where}: unknown field(s) {', '.join(show(key) for key in unknown)}; "
                            f"allowed: {', '.join(allowed)}")
    missing = [key for key in required if key not in data]
    if missing:
        raise ContractError(f"{where}: missing field(s) {', '.join(missing)}")
    return data


def _shape_fields(target: object) -> dict[str, Any]:
    names = tuple(ServingShape.__dataclass_fields__)
    fields = _fields(target, "target", (), names)
    if not fields:
        raise ContractError(f"target: name at least one shape field ({', '.join(names)})")
    for name, value in fields.items():
        if name in SHAPE_LIMITS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ContractError(f"target.{name}: expected a whole number, got {type(value).__name__} "
                                    f"{show(value)}")
            if not 1 <= value <= SHAPE_LIMITS[name]:
                raise ContractError(f"target.{name}: {show(value)} is outside 1..{SHAPE_LIMITS[name]}")
        elif value is not None:  # a dtype; None means the model's own dtype
            if not isinstance(value, str) or len(value) > 32:
                raise ContractError(f"target.{name}: expected a dtype name or null, got {show(value)}")
            try:
                dtype_width(value)
            except ContractError as error:
                raise ContractError(f"target.{name}: {error}") from None
    return dict(fields)


@dataclass(frozen=True)
class PlanRequest:
    """What an operator asks for, validated: `target` is normalised to {"cut": [..]}, {"rung": [..]} or the shape
    fields given, exactly as it goes into the plan (and its hash)."""

    kind: str
    target: dict[str, Any]
    incumbent_fingerprint: str

    @property
    def cut(self) -> Cut | None:
        """The cut a cut or ladder request moves to; None for a shape request."""
        layers = self.target.get("cut") or self.target.get("rung")
        return None if layers is None else Cut(tuple(layers))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "incumbent_fingerprint": self.incumbent_fingerprint}

    @classmethod
    def from_dict(cls, body: object, *, ranks: int, num_layers: int) -> PlanRequest:
        """Validate `{"kind", "target", "incumbent_fingerprint"}` for a rig of `ranks` ranks and a model of
        `num_layers` layers; ContractError names the field and the problem."""
        data = _fields(body, "body", REQUEST_FIELDS, REQUEST_FIELDS)
        kind, target, fingerprint = data["kind"], data["target"], data["incumbent_fingerprint"]
        if kind not in KINDS:
            raise ContractError(f"kind: {show(kind)} is not a plan kind; use one of: {', '.join(KINDS)}")
        if not isinstance(fingerprint, str) or not _FINGERPRINT.fullmatch(fingerprint):
            raise ContractError(f"incumbent_fingerprint: expected the engine's layout fingerprint (1-128 letters, "
                                f"digits or ._:-), got {show(fingerprint)}")
        if kind == "shape":
            return cls(kind, _shape_fields(target), fingerprint)
        key = "cut" if kind == "cut" else "rung"
        layers = _fields(target, "target", (key,), (key,))[key]
        cut = Cut.parse(layers, f"target.{key}", ranks=ranks, num_layers=num_layers)
        return cls(kind, {key: cut.to_list()}, fingerprint)

    @classmethod
    def from_plan(cls, plan: object, *, ranks: int, num_layers: int) -> PlanRequest:
        """Re-validate the request inside a plan (a matching hash proves consistency, not that we priced it)."""
        data = _fields(plan, "plan", PLAN_FIELDS, PLAN_FIELDS)
        return cls.from_dict({key: data[key] for key in REQUEST_FIELDS}, ranks=ranks, num_layers=num_layers)


@dataclass(frozen=True)
class Plan:
    """A priced plan, exactly as hashed: the request and what the planner `predicted` for it (`{cut, pool_tokens,
    binding_rank, ranks, feasible, reasons, notes, shape, ...}`, solvers/plans.py), carried as it came."""

    kind: str
    target: dict[str, Any]
    incumbent_fingerprint: str
    predicted: dict[str, Any]

    @property
    def hash(self) -> str:
        return plan_hash(self.to_dict())

    @property
    def feasible(self) -> bool:
        """What the planner said of the plan itself (False when it did not say)."""
        return self.predicted.get("feasible") is True

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(str(reason) for reason in self.predicted.get("reasons") or ())

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "incumbent_fingerprint": self.incumbent_fingerprint,
                "predicted": self.predicted}

    @classmethod
    def from_dict(cls, data: object, where: str = "plan") -> Plan:
        obj(data, where)
        return cls(kind=text(field(data, "kind", where), f"{where}.kind"),
                   target=dict(obj(field(data, "target", where), f"{where}.target")),
                   incumbent_fingerprint=text(field(data, "incumbent_fingerprint", where),
                                              f"{where}.incumbent_fingerprint"),
                   predicted=dict(obj(field(data, "predicted", where), f"{where}.predicted")))


@dataclass(frozen=True)
class PlanReply:
    """POST /control/plan: the plan, its hash, and whether it can be applied (with the reasons when not)."""

    plan: Plan
    plan_hash: str
    feasible: bool
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "plan_hash": self.plan_hash, "feasible": self.feasible,
                "reasons": list(self.reasons)}

    @classmethod
    def from_dict(cls, data: object, where: str = "") -> PlanReply:
        return cls(plan=Plan.from_dict(field(data, "plan", where), path(where, "plan")),
                   plan_hash=text(field(data, "plan_hash", where), path(where, "plan_hash")),
                   feasible=flag(field(data, "feasible", where), path(where, "feasible")),
                   reasons=texts(field(data, "reasons", where), path(where, "reasons")))
