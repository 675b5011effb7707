"""The driver checks every rank's allocation against the planner's prediction at start-up, after an apply and after
a restore, and refuses a mismatch (issue 35, item 1). The mismatch is real: a rank process told by
SEAM_FAULT_SHORT_POOL to allocate one KV block fewer than its layout asks in the listed builds."""

from __future__ import annotations

import time

import pytest

from contracts.control import Operation
from engine.control.driver import PipelineDriver
from engine.errors import EngineError
from solvers.rig import load_rig

pytestmark = pytest.mark.slow
START, MOVED = (7, 5, 4), (8, 4, 4)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from engine.demo import make_demo_checkpoint

    folder = tmp_path_factory.mktemp("verify-demo")
    make_demo_checkpoint(folder, force=True)
    return folder


def apply_cut(driver: PipelineDriver, cut: tuple[int, ...]) -> Operation:
    planned = driver.plan({"kind": "cut", "target": {"cut": list(cut)}, "incumbent_fingerprint": driver.fingerprint()})
    assert planned.feasible, planned.reasons
    op_id = driver.apply(planned.plan.to_dict(), planned.plan_hash)
    deadline = time.monotonic() + 120
    while (op := driver.operation(op_id)).phase != "done" or driver.phase not in ("serving", "broken"):
        assert time.monotonic() < deadline, op
        time.sleep(0.05)
    return op


def pools(driver: PipelineDriver) -> list[int]:
    return [figures["kv_pool_tokens"] for figures in driver.measured]


def test_a_start_whose_rank_allocates_another_pool_is_refused(demo, monkeypatch):
    """Pins `verify` at start-up (engine/control/driver.py): rank 1's pool is a block short, so the engine does not
    start."""
    monkeypatch.setenv("SEAM_FAULT_SHORT_POOL", "1:0")
    with pytest.raises(EngineError, match="do not match the planner's prediction: rank 1 kv_pool_tokens: predicted"):
        PipelineDriver(demo, load_rig("cpu-demo"), cut=START)


def test_an_apply_whose_rank_allocates_another_pool_rolls_back(demo, monkeypatch):
    """Pins `verify` after an apply (engine/control/operations.py): the move's build on rank 1 is a block short, so the
    operation is rolled back and the engine serves the previous layout, every pool as predicted."""
    monkeypatch.setenv("SEAM_FAULT_SHORT_POOL", "1:1")
    driver = PipelineDriver(demo, load_rig("cpu-demo"), cut=START)
    try:
        before = driver.prediction.pool_tokens
        op = apply_cut(driver, MOVED)
        assert op.status == "rolled_back", op
        assert "verification missed the prediction: rank 1 kv_pool_tokens" in op.error
        assert driver.cut == START and driver.phase == "serving" and driver.prediction.pool_tokens == before
        attention = [row.attention_layers > 0 for row in driver.prediction.ranks]
        assert [pool for pool, has in zip(pools(driver), attention, strict=True) if has] == [before] * sum(attention)
    finally:
        driver.shutdown()


def test_a_restore_whose_rank_allocates_another_pool_is_not_accepted(demo, monkeypatch):
    """Pins `verify` in a restore (engine/control/recovery.py): the move fails its check (build 1) and so does the
    rollback
    rebuilt in place (build 2); the restore then replaces the rank processes and rebuilds clean. Without the check
    the short rollback would be installed as the running layout."""
    monkeypatch.setenv("SEAM_FAULT_SHORT_POOL", "1:1,2")
    driver = PipelineDriver(demo, load_rig("cpu-demo"), cut=START)
    try:
        op = apply_cut(driver, MOVED)
        assert op.status == "rolled_back", op
        assert "every rank process was replaced" in " ".join(op.notes)
        assert driver.cut == START and driver.phase == "serving"
        rank_1 = driver.prediction.ranks[1]
        assert rank_1.attention_layers and pools(driver)[1] == driver.prediction.pool_tokens
        assert op.previous.pool_tokens == driver.prediction.pool_tokens
    finally:
        driver.shutdown()
