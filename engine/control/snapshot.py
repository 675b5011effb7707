"""What the driver shows of itself: the telemetry snapshot in the schema of docs/architecture.md §3.4 (per rank
memory and pools, engine state and health) and GET /control/state; both carry the measurement of the running layout
(its shape is solvers/measurement.py's). The driver is read through engine/control/surface.py's `Observable`."""

from __future__ import annotations

import time

from engine.control.operations import measured_figures
from engine.control.surface import Observable
from solvers.ladder import switch_cost_s
from solvers.measurement import LayoutMeasurement, PoolFigures


def build_measurement(driver: Observable) -> LayoutMeasurement:
    """What the driver measured of the layout it serves; the caller holds the driver's lock."""
    prefill_rate, decode_rate = driver.token_rates()
    stages = driver.stages.summary()
    # `real` is what the scheduler hands out: whole blocks of the pool; without attention nothing grows with tokens.
    real = driver.scheduler.blocks.capacity_tokens if driver.census.attention_layers else None
    return LayoutMeasurement(
        model=driver.model_name, rig=driver.rig.name, fingerprint=driver.fingerprint(), cut=tuple(driver.cut),
        shape=driver.shape.to_dict(), decode=stages["decode"], prefill=stages["prefill"],
        decode_tok_s=round(decode_rate, 3), prefill_tok_s=round(prefill_rate, 3),
        pool=PoolFigures(predicted=driver.prediction.pool_tokens,
                         allocated=measured_figures(driver.measured)["pool_tokens"], real=real),
        latency=driver.latency.summary())


def _build_figures(measured: dict) -> dict | None:
    figures = {key: value for key, value in measured.items() if key.startswith(("device_", "process_", "nvml_"))}
    return figures or None


def build_snapshot(driver: Observable, seq: int) -> dict:
    scheduler = driver.scheduler
    ranks = []
    for predicted, measured, spec in zip(driver.prediction.ranks, driver.measured, driver.rig.ranks, strict=True):
        free = measured["free_bytes"]
        ranks.append({
            "rank": predicted.rank, "name": spec.name, "device": spec.device, "total_bytes": measured["total_bytes"],
            "used": {"weights": measured["weights_bytes"], "kv_pool": measured["kv_pool_bytes"],
                     "state_pool": measured["state_pool_bytes"], "arena": measured.get("arena_bytes", 0),
                     "workspace": measured["workspace_bytes"], "other": measured["overhead_bytes"]},
            "free_bytes": free,
            "corridor_floor_bytes": predicted.floor.corridor_floor_bytes,
            "arming_floor_bytes": predicted.floor.bytes,
            "armable": free >= predicted.floor.bytes + predicted.margin_bytes,
            "kv": {"tokens_total": measured["kv_pool_tokens"] if predicted.attention_layers else 0,
                   "tokens_used": scheduler.blocks.used_tokens if predicted.attention_layers else 0},
            "state_slots": {"total": measured["state_slots"], "used": scheduler.slots.used_slots},
            # Real device memory (torch allocator + NVML), read by the rank during its latest steps; the build's
            # figures until it has stepped; None on CPU.
            "device_memory": driver.device_memory.get(predicted.rank) or _build_figures(measured),
        })
    measurement = build_measurement(driver)
    health = driver.health()
    return {
        "seq": seq, "ts": time.time(), "ranks": ranks,
        "engine": {"cut": list(driver.cut), "shape": driver.shape.to_dict(), "phase": driver.phase,
                   "running": len(scheduler.running), "waiting": len(scheduler.waiting),
                   "prefill_tok_s": measurement.prefill_tok_s, "decode_tok_s": measurement.decode_tok_s,
                   "reconfiguring": driver.phase not in ("serving", "starting"),
                   "fingerprint": driver.fingerprint(), "pool_tokens": driver.prediction.pool_tokens,
                   "binding_rank": driver.prediction.binding_rank, "preemptions": scheduler.preemptions,
                   # false while broken or in a recovery loop, as /healthz (engine/control/health.py)
                   "healthy": health["ok"], "recoveries_in_a_row": health["recoveries_in_a_row"],
                   "recoveries": health["recoveries"], "measurement": measurement.to_dict()},
    }


def build_state(driver: Observable) -> dict:
    """GET /control/state; the caller holds the driver's lock."""
    return {
        "model": driver.model_name, "rig": driver.rig.name, "boot_id": driver.boot_id,
        "fingerprint": driver.fingerprint(), "cut": list(driver.cut), "shape": driver.shape.to_dict(),
        "phase": driver.phase, "pool_tokens": driver.prediction.pool_tokens,
        "binding_rank": driver.prediction.binding_rank,
        "ranks": [{**row, "measured": measured}
                  for row, measured in zip(driver.prediction.table(), driver.measured, strict=True)],
        "ladder": _ladder_state(driver), "notes": driver.notes, "measurement": build_measurement(driver).to_dict(),
        "health": driver.health(),
    }


def _ladder_state(driver: Observable) -> dict:
    ladder = driver.ladder()
    if ladder is None:
        return {"armed": False}
    return {"armed": True, "rungs": [list(r) for r in driver.rungs], "current": list(driver.cut),
            "switch_cost_s": switch_cost_s(ladder, driver.cut), "image_bytes": list(ladder.image_bytes),
            "pinned_bytes": list(ladder.pinned_bytes),
            "pools": {",".join(map(str, r.cut)): r.pool_tokens for r in ladder.rungs}}
