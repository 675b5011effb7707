"""Putting a verified layout on the ranks after a failure: replace the rank processes when the process group cannot
be trusted, rebuild, verify every rank against the planner's prediction, and prove it with a test step.

A rebuild alone proves little: in a process group that gloo has closed (a peer timed out or stalled), every build
succeeds and every step then fails ('pair closure'). So a layout counts as restored only once one real step has gone
through every rank; if it does not after a rebuild in place, the rank processes are replaced and it is tried again.
"""

from __future__ import annotations

import logging

from contracts.layout import ServingShape
from engine.control.surface import Reconfigurable
from engine.errors import EngineError
from solvers.capacity import PoolResult

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


def restore(driver: Reconfigurable, cut: tuple[int, ...], shape: ServingShape, restart: bool) -> list[dict]:
    """Make `cut` and `shape` current again, verified and test-stepped; returns what the ranks measured. Running
    sequences must have been preempted (their blocks are gone with the rebuilt pools)."""
    if not restart and driver.ranks.alive():
        try:
            return _rebuild(driver, cut, shape)
        except Exception as error:  # the group may be broken in a way no rank reported: replace it, once
            log.warning("restoring %s in place failed (%s); replacing the rank processes", list(cut), error)
    driver.ranks.restart()
    return _rebuild(driver, cut, shape)


def _rebuild(driver: Reconfigurable, cut: tuple[int, ...], shape: ServingShape) -> list[dict]:
    prediction, layouts = driver.layouts(cut, shape)
    measured = driver.ranks.call_all("build", layouts)
    problems = verify(prediction, measured)
    if problems:
        raise EngineError("; ".join(problems))
    driver.adopt(cut, shape, prediction, measured)
    driver.trial_step()
    return measured
