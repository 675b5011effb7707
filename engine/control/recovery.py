"""Putting a verified layout on the ranks after a failure: replace the rank processes when the process group cannot
be trusted, rebuild, verify every rank against the planner's prediction, and prove it with a test step.

A rebuild alone proves little: in a process group that gloo has closed (a peer timed out or stalled), every build
succeeds and every step then fails ('pair closure'). So a layout counts as restored only once one real step has gone
through every rank; if it does not after a rebuild in place, the rank processes are replaced and it is tried again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from contracts.layout import ServingShape
from engine.errors import EngineError
from engine.step_plan import StepPlan
from solvers.capacity import PoolResult

if TYPE_CHECKING:
    from engine.control.driver import PipelineDriver

log = logging.getLogger("seam.engine")


def verify(prediction: PoolResult, measured: list[dict]) -> list[str]:
    """Every rank's measured pool, weights and state against the prediction; each miss named."""
    problems = []
    for predicted, got in zip(prediction.ranks, measured, strict=True):
        expected = {"kv_pool_tokens": prediction.pool_tokens if predicted.attention_layers else
                    got["kv_pool_tokens"], "weights_bytes": predicted.weights_bytes,
                    "state_pool_bytes": predicted.state_bytes,
                    "kv_pool_bytes": (prediction.pool_tokens or 0) * predicted.cell_bytes,
                    "arena_bytes": predicted.arena_bytes}
        problems += [f"rank {predicted.rank} {key}: predicted {value}, measured {got[key]}"
                     for key, value in expected.items() if got[key] != value]
    return problems


def trial_step(driver: PipelineDriver) -> None:
    """One token through every rank, in a scratch slot and block that no sequence holds (they are taken from the
    scheduler for the step); raises unless the pipeline really computes."""
    scheduler = driver.scheduler
    with driver.lock:
        blocks = scheduler.blocks.allocate(scheduler.blocks.blocks_for(1))
        slot = scheduler.slots.allocate()
    try:
        plan = StepPlan([0], [1], [0], [slot], [blocks], driver.shape.block_size, [0])
        driver.ranks.call_all("step", [plan] * driver.rig.size)
    finally:
        with driver.lock:
            scheduler.blocks.release(blocks)
            scheduler.slots.release(slot)


def restore(driver: PipelineDriver, cut: tuple[int, ...], shape: ServingShape, restart: bool) -> list[dict]:
    """Make `cut` and `shape` current again, verified and test-stepped; returns what the ranks measured. Running
    sequences must have been preempted (their blocks are gone with the rebuilt pools)."""
    if not restart and driver.ranks.alive():
        try:
            return _rebuild(driver, cut, shape)
        except Exception as error:  # the group may be broken in a way no rank reported: replace it, once
            log.warning("restoring %s in place failed (%s); replacing the rank processes", list(cut), error)
    driver.ranks.restart()
    return _rebuild(driver, cut, shape)


def _rebuild(driver: PipelineDriver, cut: tuple[int, ...], shape: ServingShape) -> list[dict]:
    prediction, layouts = driver.layouts(cut, shape)
    measured = driver.ranks.call_all("build", layouts)
    problems = verify(prediction, measured)
    if problems:
        raise EngineError("; ".join(problems))
    with driver.lock:
        driver.measured = measured
        driver._install(cut, shape, prediction)
    trial_step(driver)
    return measured
