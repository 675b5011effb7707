"""The engine refuses ranks that do not hold what the planner predicted: at start-up, at apply and at restore.

Guard pinned: engine/recovery.py `verify` (measured pool, weights and state against the prediction) at its three
call sites, engine/driver.py (start-up), engine/reconfig.py (apply) and engine/recovery.py `_rebuild` (restore).

A correct engine never produces a mismatch, so one is made at the one boundary where prediction and allocation
part: `PipelineDriver.layouts` returns the planner's prediction and the layouts the rank processes are told to
build. `SkewedDriver` tells its rank a pool some tokens off the prediction for chosen shapes; the rank process (real,
on CPU) then really allocates and measures that pool, and `verify` must catch it. The prediction itself is untouched.
"""

from __future__ import annotations

import multiprocessing
import re
import time
from dataclasses import replace

import pytest

from engine.demo import make_demo_checkpoint
from engine.driver import PipelineDriver
from engine.errors import EngineError, EngineRequestError
from engine.rank import RankLayout
from engine.sampler import SamplingParams
from solvers.capacity import PoolResult
from solvers.rig import load_rig
from solvers.serving import ServingShape

BLOCK = 16  # cpu-single's block size
SERVING_SEQS, TARGET_SEQS = 8, 4  # cpu-single's max_num_seqs, and the shape change the tests apply


class SkewedDriver(PipelineDriver):
    """Tells its ranks a pool `skews[max_num_seqs]` tokens off the planner's prediction for that shape."""

    def __init__(self, *args, skews: dict[int, int] | None = None, **kwargs):
        self.skews = dict(skews or {})
        super().__init__(*args, **kwargs)

    def layouts(self, cut: tuple[int, ...], shape: ServingShape) -> tuple[PoolResult, list[RankLayout]]:
        prediction, layouts = super().layouts(cut, shape)
        extra = self.skews.get(shape.max_num_seqs, 0)
        return prediction, [replace(layout, pool_tokens=layout.pool_tokens + extra) for layout in layouts]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verify-demo")
    make_demo_checkpoint(folder, force=True)
    return folder


def _apply_shape(driver: PipelineDriver, max_num_seqs: int) -> dict:
    planned = driver.plan({"kind": "shape", "target": {"max_num_seqs": max_num_seqs},
                           "incumbent_fingerprint": driver.fingerprint()})
    assert planned["feasible"], planned["reasons"]
    operation_id = driver.apply(planned["plan"], planned["plan_hash"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        operation = driver.operation(operation_id)
        if operation["status"] not in ("queued", "running"):
            return operation
        time.sleep(0.05)
    raise AssertionError(f"operation {operation_id} did not finish: {driver.operation(operation_id)}")


def _generate(driver: PipelineDriver) -> list[int]:
    handle = driver.submit([5, 6, 7, 8], SamplingParams(max_tokens=4, temperature=0))
    assert handle.wait(timeout=60) and handle.finish_reason == "length", handle.error
    return handle.token_ids


def _ranks_alive(within_s: float = 15.0) -> list[str]:
    """This process's rank processes still running once `within_s` has passed (a stopped rank may take a moment)."""
    deadline = time.monotonic() + within_s
    while True:
        alive = [child.name for child in multiprocessing.active_children() if child.name.startswith("seam-rank")]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def test_a_rank_pool_off_the_prediction_refuses_the_start(checkpoint):
    """Guard: `verify` at start-up (engine/driver.py). A rank that allocates one block less than predicted stops the
    engine from serving, and its rank processes are stopped."""
    with pytest.raises(EngineError, match=r"do not match the planner's prediction: rank 0 kv_pool_tokens: "
                                          r"predicted (\d+), measured (\d+)") as refused:
        SkewedDriver(checkpoint, load_rig("cpu-single"), skews={SERVING_SEQS: -BLOCK})
    found = re.search(r"predicted (\d+), measured (\d+)", str(refused.value))
    predicted, measured = (int(figure) for figure in found.groups())
    assert measured == predicted - BLOCK
    assert _ranks_alive() == []


def test_an_apply_whose_rank_misses_the_prediction_rolls_back(checkpoint):
    """Guard: `verify` at apply (engine/reconfig.py). The new shape's rank pool is one block off the prediction: the
    operation is refused at verification and the previous layout is restored, verified and serving."""
    driver = SkewedDriver(checkpoint, load_rig("cpu-single"), skews={TARGET_SEQS: -BLOCK})
    try:
        before = driver.state()
        expected = _generate(driver)
        operation = _apply_shape(driver, TARGET_SEQS)
        assert operation["status"] == "rolled_back", operation
        predicted = operation["predicted"]["pool_tokens"]
        assert operation["error"].startswith(f"verification missed the prediction: rank 0 kv_pool_tokens: "
                                             f"predicted {predicted}, measured {predicted - BLOCK}")
        assert operation["measured"]["pool_tokens"] == predicted - BLOCK  # what the rank really allocated
        assert operation["previous"]["pool_tokens"] == before["pool_tokens"]  # restored and verified
        after = driver.state()
        assert after["fingerprint"] == before["fingerprint"] and after["shape"]["max_num_seqs"] == SERVING_SEQS
        assert after["pool_tokens"] == before["pool_tokens"] and after["phase"] == "serving"
        assert _generate(driver) == expected
    finally:
        driver.shutdown()


def test_a_restore_whose_rank_misses_the_prediction_breaks_the_engine(checkpoint):
    """Guard: `verify` at restore (engine/recovery.py `_rebuild`). The apply fails for its own reason (the rank refuses
    a pool over its floor); the previous layout then comes back one block off its prediction, in place and again
    with fresh rank processes, so it is never adopted: the engine is broken and refuses requests."""
    driver = SkewedDriver(checkpoint, load_rig("cpu-single"))
    try:
        before = driver.state()
        driver.skews = {TARGET_SEQS: 4 * BLOCK, SERVING_SEQS: -BLOCK}  # from now on: over the floor, then short
        operation = _apply_shape(driver, TARGET_SEQS)
        assert operation["status"] == "failed", operation
        assert "cannot clear its arming floor" in operation["error"]
        assert (f"restoring the previous layout failed too: rank 0 kv_pool_tokens: predicted {before['pool_tokens']}, "
                f"measured {before['pool_tokens'] - BLOCK}") in operation["error"]
        assert "every rank process was replaced: the process group could not be trusted" in operation["notes"]
        assert driver.phase == "broken" and not driver.health()["ok"]
        with pytest.raises(EngineRequestError, match="could not restore a verified layout"):
            driver.submit([5, 6, 7, 8], SamplingParams(max_tokens=4))
    finally:
        driver.shutdown()
