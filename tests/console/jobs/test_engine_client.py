"""The engine client's credentials and calls, against a recording transport (what goes over the wire)."""

import json

import httpx
import pytest

from console.engine import EngineClient, EngineRefused

PLAN_HASH = "ab" * 32
STATE = {"fingerprint": "f" * 16, "cut": [8, 4, 4], "shape": {"max_model_len": 2048}, "phase": "serving"}
PLAN = {"kind": "cut", "target": {"cut": [8, 4, 4]}, "incumbent_fingerprint": "f" * 16, "predicted": {}}
OPERATION = {"id": "op-1", "job_id": 7, "status": "running", "phase": "acting", "progress": 0.4, "predicted": None,
             "measured": None, "error": None}


class Engine:
    """Records each request; answers as the engine's control API would, or 401 without the right token."""

    def __init__(self, token: str = "the-token"):
        self.token, self.requests = token, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return httpx.Response(401, json={"error": "the control API needs a bearer token"})
        if request.url.path == "/control/apply":
            return httpx.Response(202, json={"operation_id": "op-1"})
        if request.url.path == "/control/operations":
            return httpx.Response(200, json={"operations": [OPERATION]})
        if request.url.path == "/control/plan":
            return httpx.Response(200, json={"plan": PLAN, "plan_hash": PLAN_HASH, "feasible": True, "reasons": []})
        if request.url.path.startswith("/control/operations/"):
            return httpx.Response(200, json=OPERATION)
        return httpx.Response(200, json=STATE)


def client(engine: Engine, token: str) -> EngineClient:
    return EngineClient("http://engine.test", transport=httpx.MockTransport(engine), token=token)


def test_every_call_carries_the_control_token():
    engine = Engine()
    with client(engine, "the-token") as seam:
        seam.state()
        seam.plan("cut", {"cut": [8, 4, 4]}, "f" * 16)
        seam.apply({"kind": "cut"}, PLAN_HASH, {"job_id": 7})
        seam.find_operations(PLAN_HASH)
        seam.operation("op-1")
    assert [r.headers["Authorization"] for r in engine.requests] == ["Bearer the-token"] * 5


def test_the_token_defaults_to_the_settings_one(settings):
    settings.SEAM_ENGINE_TOKEN = "from-settings"
    engine = Engine("from-settings")
    with EngineClient("http://engine.test", transport=httpx.MockTransport(engine)) as seam:
        assert seam.state().fingerprint == "f" * 16


def test_apply_sends_the_attestation_beside_the_plan():
    engine, attestation = Engine(), {"job_id": 7, "approvers": ["rita"], "issued_at": 1.0, "signature": "00"}
    with client(engine, "the-token") as seam:
        assert seam.apply({"kind": "cut"}, PLAN_HASH, attestation) == "op-1"
    assert json.loads(engine.requests[0].content) == {"plan": {"kind": "cut"}, "plan_hash": PLAN_HASH,
                                                      "attestation": attestation}


def test_operations_are_found_by_plan_hash():
    engine = Engine()
    with client(engine, "the-token") as seam:
        assert [(op.id, op.job_id, op.status) for op in seam.find_operations(PLAN_HASH)] == [("op-1", 7, "running")]
    assert engine.requests[0].url.params["plan_hash"] == PLAN_HASH


def test_a_console_without_a_token_is_told_which_setting_to_set():
    engine = Engine()
    with client(engine, "") as seam, pytest.raises(EngineRefused) as refused:
        seam.state()
    assert "Authorization" not in engine.requests[0].headers
    assert refused.value.status == 401 and "set SEAM_ENGINE_TOKEN" in str(refused.value)
