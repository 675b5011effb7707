"""A captured /control/apply (token + plan + attestation) replayed after the engine was killed and restarted is
refused: the spent-job ledger is on disk (issue 30, item 1; engine/control/job_ledger.py)."""

from __future__ import annotations

import pytest

from tests.support.live_service import LiveService

pytestmark = pytest.mark.slow


def test_a_captured_apply_does_not_replay_after_a_restart(demo_checkpoint, tmp_path):
    """Pins the ledger's persistence: with the spent ids in memory only, the replay after the restart answered 202
    and moved the layout."""
    live = LiveService(demo_checkpoint, state_dir=tmp_path / "engine")  # of its own: restarted below
    try:
        start = live.state()["cut"]
        planned = live.plan("shape", {"max_num_seqs": 5})
        captured = {"plan": planned["plan"], "plan_hash": planned["plan_hash"],
                    "attestation": live.attest(planned["plan_hash"])}
        reply = live.client.post("/control/apply", json=captured)
        assert reply.status_code == 202, reply.text
        assert live.wait_operation(reply.json()["operation_id"])["status"] == "succeeded"
    finally:
        live.process.kill()  # not a clean stop: the ledger must already be on disk
        live.process.wait()
    again = LiveService(demo_checkpoint, state_dir=tmp_path / "engine", port=live.port)
    try:
        before = again.state()
        assert before["cut"] == start and before["shape"]["max_num_seqs"] != 5  # back at its start layout
        replayed = again.client.post("/control/apply", json=captured)
        assert replayed.status_code == 409, replayed.text
        assert f"job {captured['attestation']['job_id']} already started" in replayed.json()["error"]
        assert again.state()["fingerprint"] == before["fingerprint"]  # nothing moved
        assert again.client.get("/control/operations", params={"plan_hash": planned["plan_hash"]}).json() == {
            "operations": []}
    finally:
        again.stop()
