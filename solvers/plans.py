"""Pricing a plan (docs/architecture.md §3.2): a validated request (contracts.plan.PlanRequest) priced against the
running layout, as the plan the engine answers POST /control/plan with. The request, the plan, its hash and the
reply are contracts/plan.py's; the arithmetic is here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from contracts.canonical import canonical_json
from contracts.errors import ContractError
from contracts.layout import ServingShape
from contracts.plan import Plan, PlanReply, PlanRequest, plan_hash
from solvers.capacity import CutPricer, PoolResult
from solvers.census import ModelCensus
from solvers.errors import SolverError
from solvers.ladder import Ladder, switch_cost_s
from solvers.rig import Rig
from solvers.shapes import fit, safety_band

# --- pricing ------------------------------------------------------------------------------------

def _predicted(pricing: PoolResult, shape: ServingShape) -> dict[str, Any]:
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
               ladder: Ladder | None = None) -> PlanReply:
    """Price a request against the current layout: the plan, its hash, whether it is feasible and why not; changes
    nothing. A request given as a dict is parsed first (ContractError naming the field).

    cut: the target cut at the current shape. shape: the current cut at the current shape with the
    target's fields laid over it, kept only if the pool still holds the safety band (default 2 GiB;
    scaled-down rigs pass their own). ladder: the rung's cut, priced with the armed ladder's arena when
    `ladder` is given (with the predicted switch cost), else without it and a note saying so.
    """
    if isinstance(request, dict):
        request = PlanRequest.from_dict(request, ranks=rig.size, num_layers=model.num_layers)
    shape, cut, band = current_shape, request.cut, None
    if request.kind == "shape":
        try:
            shape = replace(current_shape, **request.target)
        except ContractError as error:
            raise ContractError(f"target: {error}") from None
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
    return PlanReply(Plan.from_dict(plan), plan_hash(plan), predicted["feasible"], tuple(predicted["reasons"]))
