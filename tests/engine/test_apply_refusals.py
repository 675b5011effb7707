"""Which refusal the real engine gives an apply, through its real HTTP app, without a live engine process.

The driver is the real one (engine/control/driver.py, one CPU rank on the demo model) and the app is `build_app`'s,
called
in-process: a tampered plan is 400, a stale one 409, an infeasible one 422, and none of them starts an operation or
moves the layout. tests/engine/test_service.py checks that the service forwards whatever a driver refuses;
tests/engine/test_live_reconfiguration.py does the same against a running `engine serve` (15-25 s a test).
"""

from __future__ import annotations

import itertools
import time

import pytest
from starlette.testclient import TestClient

from contracts.attestation import bearer_token, sign_attestation
from engine.control.driver import PipelineDriver
from engine.demo import make_demo_checkpoint
from engine.serve.access import Credentials
from engine.serve.http import build_app
from solvers.rig import load_rig
from tests.support.live_service import lone_head

CREDENTIALS = Credentials(control_token="control-token-for-tests", approval_key="approval-key-for-tests")
JOB_IDS = itertools.count(1)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    folder = tmp_path_factory.mktemp("apply-demo")
    make_demo_checkpoint(folder, force=True)
    driver = PipelineDriver(folder, load_rig("cpu-single"))
    yield driver
    driver.shutdown()


@pytest.fixture(scope="module")
def client(driver):
    return TestClient(build_app(driver, CREDENTIALS), headers=bearer_token(CREDENTIALS.control_token))


def plan(client: TestClient, target: dict) -> dict:
    fingerprint = client.get("/control/state").json()["fingerprint"]
    response = client.post("/control/plan", json={"kind": "shape", "target": target,
                                                  "incumbent_fingerprint": fingerprint})
    assert response.status_code == 200, response.text
    return response.json()


def apply(client: TestClient, planned: dict, plan_hash: str | None = None):
    plan_hash = plan_hash or planned["plan_hash"]
    attestation = sign_attestation(CREDENTIALS.approval_key, plan_hash, next(JOB_IDS), ["rita"], time.time(),
                                   lone_head())
    return client.post("/control/apply", json={"plan": planned["plan"], "plan_hash": plan_hash,
                                               "attestation": attestation})


def wait_operation(client: TestClient, operation_id: str) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        operation = client.get(f"/control/operations/{operation_id}").json()
        if operation["status"] not in ("queued", "running"):
            return operation
        time.sleep(0.05)
    raise AssertionError(f"operation {operation_id} did not finish")


def unchanged(client: TestClient, driver: PipelineDriver, before: dict, operations: int) -> bool:
    return client.get("/control/state").json()["fingerprint"] == before["fingerprint"] and \
        len(driver.operations()) == operations


def test_a_stale_plan_is_refused_with_409_and_changes_nothing(client, driver):
    """Guard: the fingerprint check of Operations.apply (engine/control/operations.py): a plan made for another layout
    than the
    one running is refused, even though it is well signed, attested and feasible on the new layout too."""
    stale = plan(client, {"max_num_seqs": 6})
    moved = apply(client, plan(client, {"max_num_seqs": 5}))
    assert moved.status_code == 202, moved.text
    assert wait_operation(client, moved.json()["operation_id"])["status"] == "succeeded"
    before, operations = client.get("/control/state").json(), len(driver.operations())
    response = apply(client, stale)
    assert response.status_code == 409, response.text
    assert response.json()["error"] == (f"the plan was made for layout {stale['plan']['incumbent_fingerprint']}; the "
                                        f"engine now runs {before['fingerprint']}: plan again")
    assert unchanged(client, driver, before, operations)


def test_a_tampered_plan_is_refused_with_400_and_changes_nothing(client, driver):
    before, operations = client.get("/control/state").json(), len(driver.operations())
    planned = plan(client, {"max_num_seqs": 7})
    planned["plan"]["target"]["max_num_seqs"] = 3  # the reviewed hash no longer matches what would run
    response = apply(client, planned)
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("plan_hash does not match the plan")
    assert unchanged(client, driver, before, operations)


def test_an_infeasible_plan_is_refused_with_422_and_changes_nothing(client, driver):
    before, operations = client.get("/control/state").json(), len(driver.operations())
    planned = plan(client, {"max_model_len": 1_000_000})
    assert not planned["feasible"]
    response = apply(client, planned)
    assert response.status_code == 422, response.text
    assert response.json()["error"].startswith("the plan is infeasible: pool ")
    assert "cannot hold one sequence of max_model_len 1000000" in response.json()["error"]
    assert unchanged(client, driver, before, operations)
