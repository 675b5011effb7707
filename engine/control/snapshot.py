"""What the driver shows of itself: the telemetry snapshot (contracts/telemetry.py's Snapshot: per rank memory and
pools, engine state and health) and GET /control/state (contracts/control.py's EngineState); both carry the
measurement of the running layout (contracts/measurement.py's). The driver is read through
engine/control/surface.py's `Observable`."""

from __future__ import annotations

import time

from contracts.control import EngineState, LadderState
from contracts.layout import Cut
from contracts.measurement import LayoutMeasurement, PoolFigures
from contracts.telemetry import EngineSnapshot, MemoryUse, RankSnapshot, Snapshot
from engine.control.operations import measured_figures
from engine.control.surface import Observable
from solvers.ladder import switch_cost_s


def build_measurement(driver: Observable) -> LayoutMeasurement:
    """What the driver measured of the layout it serves; the caller holds the driver's lock."""
    prefill_rate, decode_rate = driver.token_rates()
    stages = driver.stages.summary()
    # `real` is what the scheduler hands out: whole blocks of the pool; without attention nothing grows with tokens.
    real = driver.scheduler.blocks.capacity_tokens if driver.census.attention_layers else None
    return LayoutMeasurement(
        model=driver.model_name, rig=driver.rig.name, fingerprint=driver.fingerprint(), cut=Cut(tuple(driver.cut)),
        shape=driver.shape.to_dict(), decode=stages["decode"], prefill=stages["prefill"],
        decode_tok_s=round(decode_rate, 3), prefill_tok_s=round(prefill_rate, 3),
        pool=PoolFigures(predicted=driver.prediction.pool_tokens,
                         allocated=measured_figures(driver.measured).pool_tokens, real=real),
        latency=driver.latency.summary())


def _build_figures(measured: dict) -> dict | None:
    figures = {key: value for key, value in measured.items() if key.startswith(("device_", "process_", "nvml_"))}
    return figures or None


def build_snapshot(driver: Observable, seq: int) -> Snapshot:
    scheduler = driver.scheduler
    ranks = []
    for predicted, measured, spec in zip(driver.prediction.ranks, driver.measured, driver.rig.ranks, strict=True):
        free = measured["free_bytes"]
        holds_kv = bool(predicted.attention_layers)
        ranks.append(RankSnapshot(
            rank=predicted.rank, name=spec.name, device=spec.device, total_bytes=measured["total_bytes"],
            used=MemoryUse(weights=measured["weights_bytes"], kv_pool=measured["kv_pool_bytes"],
                           state_pool=measured["state_pool_bytes"], arena=measured.get("arena_bytes", 0),
                           workspace=measured["workspace_bytes"], other=measured["overhead_bytes"]),
            free_bytes=free, corridor_floor_bytes=predicted.floor.corridor_floor_bytes,
            arming_floor_bytes=predicted.floor.bytes, armable=free >= predicted.floor.bytes + predicted.margin_bytes,
            pool_tokens=measured["kv_pool_tokens"] if holds_kv else 0,
            pool_tokens_used=scheduler.blocks.used_tokens if holds_kv else 0,
            state_slots=measured["state_slots"], state_slots_used=scheduler.slots.used_slots,
            # Real device memory (torch allocator + NVML), read by the rank during its latest steps; the build's
            # figures until it has stepped; None on CPU.
            device_memory=driver.device_memory.get(predicted.rank) or _build_figures(measured)))
    measurement = build_measurement(driver)
    health = driver.health()
    engine = EngineSnapshot(
        cut=Cut(tuple(driver.cut)), shape=driver.shape.to_dict(), phase=driver.phase, running=len(scheduler.running),
        waiting=len(scheduler.waiting), prefill_tok_s=measurement.prefill_tok_s, decode_tok_s=measurement.decode_tok_s,
        reconfiguring=driver.phase not in ("serving", "starting"), fingerprint=driver.fingerprint(),
        pool_tokens=driver.prediction.pool_tokens, binding_rank=driver.prediction.binding_rank,
        preemptions=scheduler.preemptions,
        # false while broken or in a recovery loop, as /healthz (engine/control/health.py)
        healthy=health.ok, recoveries_in_a_row=health.recoveries_in_a_row, recoveries=health.recoveries,
        measurement=measurement)
    return Snapshot(seq=seq, ts=time.time(), ranks=tuple(ranks), engine=engine)


def build_state(driver: Observable) -> EngineState:
    """GET /control/state; the caller holds the driver's lock."""
    return EngineState(
        model=driver.model_name, rig=driver.rig.name, boot_id=driver.boot_id, fingerprint=driver.fingerprint(),
        cut=Cut(tuple(driver.cut)), shape=driver.shape, phase=driver.phase,
        pool_tokens=driver.prediction.pool_tokens, binding_rank=driver.prediction.binding_rank,
        ranks=tuple({**row, "measured": measured}
                    for row, measured in zip(driver.prediction.table(), driver.measured, strict=True)),
        ladder=_ladder_state(driver), notes=tuple(driver.notes), measurement=build_measurement(driver),
        health=driver.health())


def _ladder_state(driver: Observable) -> LadderState:
    ladder = driver.ladder()
    if ladder is None:
        return LadderState(armed=False)
    return LadderState(armed=True, rungs=tuple(Cut(tuple(rung)) for rung in driver.rungs),
                       current=Cut(tuple(driver.cut)), switch_cost_s=switch_cost_s(ladder, driver.cut),
                       image_bytes=tuple(ladder.image_bytes), pinned_bytes=tuple(ladder.pinned_bytes),
                       pool_tokens={Cut(tuple(rung.cut)).to_text(): rung.pool_tokens for rung in ladder.rungs})
