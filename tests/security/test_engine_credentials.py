"""The engine's credentials (issue 13, item 1), against the real service: the control token on /control/*, the
console's attestation on apply, one apply per job, the optional API key on /v1, and no public /v1 by accident.

One engine serves the module: `guarded` holds every credential (the control token and approval key the test
session hands its children, and an API key); one test starts an engine with none of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from contracts.attestation import API_KEY_ENV, APPROVAL_KEY_ENV, CONTROL_TOKEN_ENV, bearer_token, sign_attestation
from engine.serve.access import Credentials, exposure_notices
from tests.support.live_service import ROOT, LiveService, free_port, lone_head

API_KEY = "test-api-key"
SOME_HASH = "ab" * 32
PROMPT = {"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def guarded(demo_checkpoint):
    # Not the run's shared engine: this one requires an API key on /v1, which the other tests do not send.
    live = LiveService(demo_checkpoint, extra_env={API_KEY_ENV: API_KEY})
    yield live
    live.stop()


CONTROL_CALLS = [("GET", "/control/state", None), ("POST", "/control/plan", {"kind": "shape", "target": {}}),
                 ("POST", "/control/apply", {"plan": {}, "plan_hash": SOME_HASH}),
                 ("GET", "/control/operations/op-1", None), ("GET", f"/control/operations?plan_hash={SOME_HASH}", None)]


def _refused(reply, status: int = 401) -> str:
    assert reply.status_code == status, reply.text
    return reply.json()["error"]


@pytest.mark.parametrize(("method", "path", "body"), CONTROL_CALLS)
def test_the_control_api_without_a_token_is_401_naming_the_fix(guarded, method, path, body):
    reply = guarded.anonymous.request(method, path, json=body)
    assert CONTROL_TOKEN_ENV in _refused(reply)
    assert reply.headers["www-authenticate"].startswith("Bearer ") and CONTROL_TOKEN_ENV in \
        reply.headers["www-authenticate"]


@pytest.mark.parametrize("authorization", ["Bearer not-the-token", f"Basic {CONTROL_TOKEN_ENV}", "Bearer",
                                           "Bearer tok\u00e9n".encode()])
def test_a_wrong_control_token_is_401(guarded, authorization):
    reply = guarded.anonymous.get("/control/state", headers={"Authorization": authorization})
    assert CONTROL_TOKEN_ENV in _refused(reply) and "www-authenticate" in reply.headers


def test_the_api_key_does_not_open_the_control_api(guarded):
    _refused(guarded.anonymous.get("/control/state", headers=bearer_token(API_KEY)))


def test_an_engine_started_without_a_token_keeps_control_closed_and_still_serves_v1(demo_checkpoint):
    bare = LiveService(demo_checkpoint, rig="cpu-single",
                       extra_env={CONTROL_TOKEN_ENV: "", APPROVAL_KEY_ENV: "", API_KEY_ENV: ""})
    try:
        for method, path, body in CONTROL_CALLS:
            reply = bare.anonymous.request(method, path, json=body, headers=bearer_token("a-token-it-never-got"))
            assert f"started without {CONTROL_TOKEN_ENV}" in _refused(reply)
        assert bare.anonymous.post("/v1/completions", json=PROMPT).status_code == 200
        assert any(f"{CONTROL_TOKEN_ENV} is not set" in line for line in bare.output)
    finally:
        bare.stop()


def _plan(live: LiveService, max_num_seqs: int) -> dict:
    return live.plan("shape", {"max_num_seqs": max_num_seqs})


def test_apply_without_an_attestation_is_403_and_changes_nothing(guarded):
    before = guarded.state()["fingerprint"]
    planned = _plan(guarded, 6)
    reply = guarded.client.post("/control/apply", json={"plan": planned["plan"],
                                                         "plan_hash": planned["plan_hash"]})
    assert "attestation" in _refused(reply, 403)
    assert guarded.state()["fingerprint"] == before


def _forged(guarded: LiveService, planned: dict, how: str) -> dict:
    now = time.time()
    if how == "another key":
        return sign_attestation("not-the-console's-key", planned["plan_hash"], 7, ["alice"], now, lone_head())
    if how == "another plan":
        return guarded.attest(_plan(guarded, 5)["plan_hash"])
    if how == "expired":
        return sign_attestation(guarded.approval_key, planned["plan_hash"], 7, ["alice"], now - 3 * 86400,
                                lone_head())
    attestation = guarded.attest(planned["plan_hash"])
    return attestation | {"approvers": ["mallory"]}  # "approvers changed": the signature no longer covers them


@pytest.mark.parametrize("how", ["another key", "another plan", "expired", "approvers changed"])
def test_a_forged_or_misdirected_attestation_is_403_and_changes_nothing(guarded, how):
    before = guarded.state()["fingerprint"]
    planned = _plan(guarded, 6)
    reply = guarded.apply(planned, attestation=_forged(guarded, planned, how))
    assert "attestation" in _refused(reply, 403)
    assert guarded.state()["fingerprint"] == before


def test_a_valid_attestation_applies_and_its_operation_is_found_by_plan_hash(guarded):
    planned = _plan(guarded, 6)
    attestation = guarded.attest(planned["plan_hash"])
    reply = guarded.apply(planned, attestation=attestation)
    assert reply.status_code == 202, reply.text
    operation = guarded.wait_operation(reply.json()["operation_id"])
    assert operation["status"] == "succeeded" and operation["job_id"] == attestation["job_id"]
    found = guarded.client.get("/control/operations", params={"plan_hash": planned["plan_hash"].upper()})
    assert [op["id"] for op in found.json()["operations"]] == [operation["id"]]
    assert guarded.client.get("/control/operations", params={"plan_hash": SOME_HASH}).json() == {"operations": []}


@pytest.mark.parametrize("query", ["", "?plan_hash=", "?plan_hash=abc", f"?plan_hash={'g' * 64}"])
def test_an_operations_lookup_without_a_well_formed_plan_hash_is_400(guarded, query):
    assert "plan_hash" in _refused(guarded.client.get(f"/control/operations{query}"), 400)


def test_a_job_id_applies_once(guarded):
    first = _plan(guarded, 5)
    used = guarded.attest(first["plan_hash"])
    assert guarded.wait_operation(guarded.apply(first, used).json()["operation_id"])["status"] == "succeeded"
    second = _plan(guarded, 4)
    replayed = guarded.apply(second, guarded.attest(second["plan_hash"], job_id=used["job_id"]))
    assert f"job {used['job_id']} already started" in _refused(replayed, 409)
    assert guarded.apply(second).status_code == 202  # the same plan with a job of its own goes through


def test_v1_needs_the_api_key_when_one_is_set(guarded):
    for headers in ({}, bearer_token("wrong-key"), bearer_token(guarded.control_token)):
        reply = guarded.anonymous.post("/v1/completions", json=PROMPT, headers=headers)
        error = _refused(reply)
        assert error["type"] == "invalid_request_error" and API_KEY_ENV in error["message"]
        assert guarded.anonymous.get("/v1/models", headers=headers).status_code == 401
    assert guarded.anonymous.post("/v1/completions", json=PROMPT, headers=bearer_token(API_KEY)).status_code == 200


def test_healthz_and_metrics_stay_open(guarded):
    assert guarded.anonymous.get("/healthz").status_code == 200
    assert guarded.anonymous.get("/metrics").status_code == 200


def test_serving_beyond_loopback_without_an_api_key_refuses_to_start(tmp_path):
    env = {**os.environ, API_KEY_ENV: ""}
    done = subprocess.run([sys.executable, "-m", "engine", "serve", "--checkpoint", str(tmp_path), "--host",
                           "0.0.0.0", "--port", str(free_port())], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and API_KEY_ENV in errors[0] and "--allow-open-v1" in errors[0]


def test_allow_open_v1_serves_beyond_loopback_with_a_loud_warning():
    credentials = Credentials(control_token="t", approval_key="k")
    assert exposure_notices("127.0.0.1", credentials, allow_open_v1=False) == []
    [warning] = exposure_notices("0.0.0.0", credentials, allow_open_v1=True)
    assert warning.startswith("WARNING") and API_KEY_ENV in warning
    assert exposure_notices("0.0.0.0", Credentials(api_key="a", control_token="t"), allow_open_v1=False) == []
