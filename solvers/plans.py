"""The Plan contract (docs/architecture.md §3.2): parse a request, price it, hash it, verify it.

A plan is `{kind, target, incumbent_fingerprint, predicted}`; `plan_hash` is the sha256 of its
canonical JSON, so an approval bound to a hash is bound to every byte of the plan. The engine service
and the console both use this module: one parser, one pricing, one hash. Request bodies are untrusted
(they arrive over HTTP), so every refusal is a SolverError naming the field and the problem.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from solvers.capacity import CutPricer, PoolResult
from solvers.census import ModelCensus
from solvers.dtypes import width
from solvers.errors import SolverError
from solvers.ladder import Ladder, switch_cost_s
from solvers.rig import Rig
from solvers.serving import ServingShape
from solvers.shapes import fit, safety_band

KINDS = ("cut", "shape", "ladder")
REQUEST_FIELDS = ("kind", "target", "incumbent_fingerprint")
# Ceilings that no real shape reaches; they keep absurd values from reaching the arithmetic.
SHAPE_LIMITS = {"max_model_len": 2**24, "max_num_seqs": 65536, "max_num_batched_tokens": 2**24, "block_size": 4096}
_FINGERPRINT = re.compile(r"[A-Za-z0-9._:-]{1,128}")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 2, 3, 4, 40, 40, 24


def _show(value: object) -> str:
    """A short repr for messages: hostile input must not make the message itself huge or fail."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        return f"a {value.bit_length()}-bit integer"
    try:
        return _REPR.repr(value)
    except ValueError:  # an integer past Python's digit limit, nested in a container
        return f"a {type(value).__name__} holding an over-long integer"


# --- canonical JSON and hashes ------------------------------------------------------------------

def _check_json(value: object, where: str) -> None:
    """Only plain JSON types: a tuple and a list hash alike, but {1: x} and {"1": x} must not."""
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SolverError(f"{where}: {value!r} has no JSON form; plans carry finite numbers only")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SolverError(f"{where}: key {_show(key)} is not a string")
            _check_json(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json(item, f"{where}[{index}]")
    else:
        raise SolverError(f"{where}: {type(value).__name__} has no JSON form")


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace, ASCII only, floats as Python repr; NaN and infinities refused."""
    _check_json(obj, "plan")
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except ValueError as error:  # e.g. an integer past Python's digit limit
        raise SolverError(f"plan: cannot be written as canonical JSON ({error})") from error


def plan_hash(plan: dict) -> str:
    return hashlib.sha256(canonical_json(plan).encode("ascii")).hexdigest()


def verify_plan(plan: dict, plan_hash_hex: str) -> None:
    """Refuse a plan whose hash is not the one given: what was reviewed is exactly what runs."""
    if not isinstance(plan, dict):
        raise SolverError(f"plan: expected an object, got {type(plan).__name__}")
    if not isinstance(plan_hash_hex, str):
        raise SolverError(f"plan_hash: expected a hex string, got {type(plan_hash_hex).__name__}")
    actual = plan_hash(plan)
    if not hmac.compare_digest(actual, plan_hash_hex.lower()):
        raise SolverError(f"plan_hash does not match the plan: got {_show(plan_hash_hex)}, the plan's canonical "
                          f"JSON hashes to {actual}; the plan changed after it was hashed")


def layout_fingerprint(cut: Sequence[int], shape: ServingShape, rung: Sequence[int] | None = None) -> str:
    """16 hex digits naming a layout: any change of cut, shape or rung changes it."""
    content = {"cut": list(cut), "shape": shape.to_dict(), "rung": None if rung is None else list(rung)}
    return hashlib.sha256(canonical_json(content).encode("ascii")).hexdigest()[:16]


# --- parsing untrusted request bodies -----------------------------------------------------------

@dataclass(frozen=True)
class PlanRequest:
    kind: str
    target: dict  # normalised: {"cut": [..]}, {"rung": [..]} or the shape fields given
    incumbent_fingerprint: str

    @property
    def cut(self) -> tuple[int, ...] | None:
        layers = self.target.get("cut") or self.target.get("rung")
        return None if layers is None else tuple(layers)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "target": self.target, "incumbent_fingerprint": self.incumbent_fingerprint}


def _fields(data: object, where: str, required: Sequence[str], allowed: Sequence[str]) -> dict:
    if not isinstance(data, dict):
        raise SolverError(f"{where}: expected an object, got {type(data).__name__}")
    unknown = [key for key in data if key not in allowed]
    if unknown:
        raise SolverError(f"{where}: unknown field(s) {', '.join(_show(key) for key in unknown)}; "
                          f"allowed: {', '.join(allowed)}")
    missing = [key for key in required if key not in data]
    if missing:
        raise SolverError(f"{where}: missing field(s) {', '.join(missing)}")
    return data


def parse_cut(value: object, where: str, rig_size: int, num_layers: int) -> list[int]:
    """A cut from JSON: one positive whole number of layers per rank, summing to the model's layers."""
    if not isinstance(value, list):
        raise SolverError(f"{where}: expected a list of {rig_size} layer counts (one per rank), "
                          f"got {type(value).__name__}")
    if len(value) != rig_size:
        raise SolverError(f"{where}: has {len(value)} entries; the rig has {rig_size} ranks")
    for index, layers in enumerate(value):
        if isinstance(layers, bool) or not isinstance(layers, int):
            raise SolverError(f"{where}[{index}]: expected a whole number of layers, got "
                              f"{type(layers).__name__} {_show(layers)}")
        if layers < 1:
            raise SolverError(f"{where}[{index}]: every rank needs at least 1 layer (got {_show(layers)})")
        if layers > num_layers:
            raise SolverError(f"{where}[{index}]: {_show(layers)} layers is more than the model's {num_layers}")
    if sum(value) != num_layers:
        raise SolverError(f"{where}: sums to {sum(value)} layers; the model has {num_layers}")
    return list(value)


def _parse_shape_fields(target: object) -> dict:
    names = tuple(ServingShape.__dataclass_fields__)
    fields = _fields(target, "target", (), names)
    if not fields:
        raise SolverError(f"target: name at least one shape field ({', '.join(names)})")
    for name, value in fields.items():
        if name in SHAPE_LIMITS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise SolverError(f"target.{name}: expected a whole number, got {type(value).__name__} {_show(value)}")
            if not 1 <= value <= SHAPE_LIMITS[name]:
                raise SolverError(f"target.{name}: {_show(value)} is outside 1..{SHAPE_LIMITS[name]}")
        elif value is not None:  # a dtype; None means the model's own dtype
            if not isinstance(value, str) or len(value) > 32:
                raise SolverError(f"target.{name}: expected a dtype name or null, got {_show(value)}")
            try:
                width(value)
            except SolverError as error:
                raise SolverError(f"target.{name}: {error}") from None
    return dict(fields)


def parse_plan_request(body: object, rig_size: int, num_layers: int) -> PlanRequest:
    """Validate `{"kind", "target", "incumbent_fingerprint"}`; SolverError names the field and the problem."""
    data = _fields(body, "body", REQUEST_FIELDS, REQUEST_FIELDS)
    kind, target, fingerprint = data["kind"], data["target"], data["incumbent_fingerprint"]
    if kind not in KINDS:
        raise SolverError(f"kind: {_show(kind)} is not a plan kind; use one of: {', '.join(KINDS)}")
    if not isinstance(fingerprint, str) or not _FINGERPRINT.fullmatch(fingerprint):
        raise SolverError(f"incumbent_fingerprint: expected the engine's layout fingerprint (1-128 letters, "
                          f"digits or ._:-), got {_show(fingerprint)}")
    if kind == "shape":
        return PlanRequest(kind, _parse_shape_fields(target), fingerprint)
    key = "cut" if kind == "cut" else "rung"
    layers = _fields(target, "target", (key,), (key,))[key]
    return PlanRequest(kind, {key: parse_cut(layers, f"target.{key}", rig_size, num_layers)}, fingerprint)


def request_from_plan(plan: object, rig_size: int, num_layers: int) -> PlanRequest:
    """Re-validate the request inside a plan (a matching hash proves consistency, not that we priced it)."""
    data = _fields(plan, "plan", (*REQUEST_FIELDS, "predicted"), (*REQUEST_FIELDS, "predicted"))
    return parse_plan_request({key: data[key] for key in REQUEST_FIELDS}, rig_size, num_layers)


# --- pricing ------------------------------------------------------------------------------------

def _predicted(pricing: PoolResult, shape: ServingShape) -> dict:
    return {"cut": list(pricing.cut), "pool_tokens": pricing.pool_tokens, "binding_rank": pricing.binding_rank,
            "attention_split": list(pricing.attention_split), "ranks": pricing.table(),
            "feasible": pricing.feasible, "reasons": list(pricing.reasons), "notes": list(pricing.notes),
            "shape": shape.to_dict()}


def _band_check(model: ModelCensus, pricing: PoolResult, shape: ServingShape,
                band: int | str | None) -> tuple[dict | None, str | None]:
    """One full-length sequence must fit in the pool less the safety band (docs/domain.md §8).

    One sequence, not max_num_seqs of them: the scheduler preempts when the pool runs dry, but a pool
    that cannot hold one max_model_len sequence beside the band can never serve what the shape promises.
    """
    per_token = model.kv_bytes_per_token(shape.kv_dtype)
    if per_token == 0 or not pricing.feasible or pricing.pool_tokens is None:
        return None, None  # nothing token-bound, or the cut is already refused with its own reason
    result = fit(pricing.pool_tokens * per_token, per_token, shape.max_model_len, 1, safety_band(band))
    reason = None if result.fits else f"shape breaks the safety band: {result.refusal}"
    return result.to_dict(), reason


def build_plan(request: PlanRequest | dict, model: ModelCensus, rig: Rig, current_cut: Sequence[int],
               current_shape: ServingShape, *, safety_band_bytes: int | str | None = None,
               ladder: Ladder | None = None) -> dict:
    """Price a request against the current layout: `{plan, plan_hash, feasible, reasons}`; changes nothing.

    cut: the target cut at the current shape. shape: the current cut at the current shape with the
    target's fields laid over it, kept only if the pool still holds the safety band (default 2 GiB;
    scaled-down rigs pass their own). ladder: the rung's cut, priced with the armed ladder's arena when
    `ladder` is given (with the predicted switch cost), else without it and a note saying so.
    """
    if isinstance(request, dict):
        request = parse_plan_request(request, rig.size, model.num_layers)
    shape, cut, band = current_shape, request.cut, None
    if request.kind == "shape":
        try:
            shape = replace(current_shape, **request.target)
        except SolverError as error:
            raise SolverError(f"target: {error}") from None
        cut = tuple(current_cut)
    rung = None
    if request.kind == "ladder" and ladder is not None:
        rung = next((r for r in ladder.rungs if r.cut == tuple(cut)), None)
        if rung is None:
            raise SolverError(f"target.rung: {list(cut)} is not a rung of the armed ladder "
                              f"{[list(r.cut) for r in ladder.rungs]}")
    pricing = rung.pool if rung is not None else CutPricer(model, rig, shape).price(cut)
    predicted = _predicted(pricing, shape)
    if request.kind == "shape":
        band, reason = _band_check(model, pricing, shape,
                                   safety_band_bytes if safety_band_bytes is not None else rig.safety_band_bytes)
        predicted["safety_band"] = band
        if reason:
            predicted["reasons"].append(reason)
            predicted["feasible"] = False
    if rung is not None:
        predicted["switch_cost_s"] = switch_cost_s(ladder, rung.cut, current_cut)
    elif request.kind == "ladder":
        predicted["notes"].append("priced without the ladder's arena; the engine adds it for its armed ladder")
    # Through canonical JSON and back: the plan holds only JSON types, so it hashes the same after a round trip.
    plan = json.loads(canonical_json({**request.to_dict(), "predicted": predicted}))
    return {"plan": plan, "plan_hash": plan_hash(plan), "feasible": predicted["feasible"],
            "reasons": list(predicted["reasons"])}
