"""Malformed and adversarial proposals through POST /api/v1/jobs/, authenticated with a real token.

Each is refused with a 4xx whose message names the problem (the field or path), nothing changes (no job, the
engine's layout as it was), and the refused attempt is an audit event: `job.propose_refused` with the actor,
the body's digest and the reason. A plan_hash that is not the job's plan is refused at approval the same way.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from rest_framework.test import APIClient

from console.accounts.tokens import issue_token
from console.api.parsers import MAX_BODY_BYTES, MAX_DEPTH
from console.audit.models import AuditEvent
from console.audit.services import verify_chain
from console.jobs.models import Approval, Job
from console.jobs.refusals import body_digest

pytestmark = pytest.mark.django_db

CUT = {"cut": [8, 4, 4]}

# (body, status, what the message must name)
BAD_BODIES = [
    ({"kind": "cut", "target": {"cut": [-1, 9, 8]}}, 400, "target.cut[0]"),
    ({"kind": "cut", "target": {"cut": [0, 8, 8]}}, 400, "target.cut[0]"),
    ({"kind": "cut", "target": {"cut": [4, 4, 4]}}, 400, "target.cut: sums to 12 layers; the model has 16"),
    ({"kind": "cut", "target": {"cut": [10**30, 1, 1]}}, 400, "target.cut[0]"),
    ({"kind": "cut", "target": {"cut": [2**63, -(2**63) + 14, 2]}}, 400, "target.cut"),
    ({"kind": "cut", "target": {"cut": [8.0, 4, 4]}}, 400, "target.cut[0]: expected a whole number"),
    ({"kind": "cut", "target": {"cut": [8.5, 4, 3.5]}}, 400, "target.cut[0]"),
    ({"kind": "cut", "target": {"cut": ["8", "4", "4"]}}, 400, "target.cut[0]"),
    ({"kind": "cut", "target": {"cut": [True, 7, 8]}}, 400, "target.cut[0]"),
    ({"kind": "cut", "target": {"cut": None}}, 400, "target.cut"),
    ({"kind": "cut", "target": {"cut": [[8], [4], [4]]}}, 400, "target.cut[0]"),
    ({"kind": "cut", "target": {"cut": {"a": {"b": {"c": [1]}}}}}, 400, "target.cut"),
    ({"kind": "cut", "target": {"cut": [16]}}, 400, "target.cut: has 1 entries; the rig has 3 ranks"),
    ({"kind": "cut", "target": {}}, 400, "target: missing field(s) cut"),
    ({"kind": "cut", "target": {**CUT, "extra": 1}}, 400, "target: unknown field(s) 'extra'"),
    ({"kind": "cut", "target": [8, 4, 4]}, 400, "target: expected an object"),
    ({"kind": "shape", "target": {"max_num_seqs": -5}}, 400, "target.max_num_seqs"),
    ({"kind": "shape", "target": {"max_num_seqs": 10**12}}, 400, "target.max_num_seqs"),
    ({"kind": "shape", "target": {"kv_dtype": "int3"}}, 400, "target.kv_dtype"),
    ({"kind": "shape", "target": {"max_model_len": None}}, 400, "target.max_model_len"),
    ({"kind": "teleport", "target": CUT}, 400, "kind: 'teleport' is not a plan kind"),
    ({"kind": None, "target": None}, 400, "kind"),
    ({"kind": ["cut"], "target": CUT}, 400, "kind"),
    ({"target": CUT}, 400, "body: missing field(s) kind"),
    ({"kind": "cut", "target": CUT, "admin": True}, 400, "body: unknown field(s) admin"),
    ({"kind": "cut", "target": CUT, "plan_hash": "0" * 64}, 400, "body: unknown field(s) plan_hash"),
    ({"kind": "cut", "target": CUT, "incumbent_fingerprint": 5}, 400, "incumbent_fingerprint: expected a string"),
    ({"kind": "cut", "target": CUT, "incumbent_fingerprint": "x" * 5000}, 409, "incumbent_fingerprint"),
    ([1, 2, 3], 400, "body: expected a JSON object"),
    ("cut", 400, "body: expected a JSON object"),
    (12, 400, "body: expected a JSON object"),
]


@pytest.fixture
def token_client(operator):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(operator).secret}")
    return client


@pytest.fixture
def unchanged(live_engine):
    """Asserts, after the test, that no job exists and the engine's layout is the one it had before."""
    before = live_engine.state()["fingerprint"]
    yield
    assert Job.objects.count() == 0
    assert live_engine.state()["fingerprint"] == before


def refused_event(actor) -> AuditEvent:
    event = AuditEvent.objects.filter(action="job.propose_refused").order_by("-seq").first()
    assert event is not None, "the refused attempt left no audit event"
    assert event.actor == actor and event.actor_name == actor.get_username() and event.subject == "jobs"
    assert verify_chain().first_broken is None  # every link holds (uncommitted, so never anchored: not "ok")
    return event


@pytest.mark.parametrize("body, code, names", BAD_BODIES, ids=[repr(b)[:60] for b, _, _ in BAD_BODIES])
def test_a_bad_plan_is_refused_naming_the_problem_and_audited(token_client, operator, unchanged, body, code, names):
    response = token_client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == code, response.content[:500]
    detail = response.json()["detail"]
    assert names in detail
    event = refused_event(operator)
    assert event.payload["reason"] == detail and event.payload["body_sha256"] == body_digest(body)
    assert event.payload["code"] == response.json()["code"]


@pytest.mark.parametrize("raw, content_type, code, names", [
    (b'{"kind": "cut", "target": {"cut": [8, 4, 4]', "application/json", 400, "body: not valid JSON"),
    (b'{"kind": "cut", "target": {"cut": [NaN, 4, 4]}}', "application/json", 400, "NaN is not a JSON number"),
    (b'{"kind": "cut", "target": {"cut": [Infinity, 4, 4]}}', "application/json", 400, "Infinity"),
    (b'{"kind": "cut", "target": {"cut": [1e999, 4, 4]}}', "application/json", 400, "1e999 is out of range"),
    (b"\xff\xfe{}", "application/json", 400, "body: not valid JSON"),
    (b'{"kind": "cut", "target": ' + b"[" * 5000 + b"]" * 5000 + b"}", "application/json", 400,
     f"body: JSON nested deeper than {MAX_DEPTH} levels"),
    (json.dumps({"kind": "cut", "target": {"cut": [8, 4, 4], "pad": "x" * MAX_BODY_BYTES}}).encode(),
     "application/json", 413, f"body: larger than {MAX_BODY_BYTES} bytes"),
    (b"kind=cut&target=8,4,4", "text/plain", 415, "text/plain"),
], ids=["truncated", "nan", "infinity", "1e999", "not-utf8", "deep", "oversized", "media-type"])
def test_a_body_that_is_not_a_plan_at_all_is_refused_and_audited(token_client, operator, unchanged, raw,
                                                                 content_type, code, names):
    response = token_client.generic("POST", "/api/v1/jobs/", raw, content_type=content_type)
    assert response.status_code == code, response.content[:500]
    detail = response.json()["detail"]
    assert names in detail
    event = refused_event(operator)
    assert event.payload["reason"] == detail
    # The parser read these bytes: the digest is theirs. A body of the wrong media type was never read.
    read = body_digest(None) if code == 415 else hashlib.sha256(raw[:MAX_BODY_BYTES + 1]).hexdigest()
    assert event.payload["body_sha256"] == read


def test_a_viewer_proposing_is_refused_and_audited(live_engine, viewer, post, unchanged):
    body = {"kind": "cut", "target": CUT}
    answer = post("/api/v1/jobs/", body, user=viewer, expect=403)
    assert "needs the operator role" in answer["detail"]
    assert refused_event(viewer).payload["body_sha256"] == body_digest(body)


def test_an_infeasible_plan_is_refused_with_the_engines_reasons_and_audited(token_client, operator, unchanged):
    response = token_client.post("/api/v1/jobs/", {"kind": "cut", "target": {"cut": [1, 1, 14]}}, format="json")
    assert response.status_code == 422, response.content
    assert response.json()["field"] == "target" and response.json()["reasons"]
    assert refused_event(operator).payload["code"] == "PlanInfeasible"


def test_an_approval_for_another_plan_hash_changes_nothing(live_engine, proposed, reviewer, post, handoffs):
    job = proposed()
    before = live_engine.state()["fingerprint"]
    forged = hashlib.sha256(b"a plan nobody reviewed").hexdigest()
    answer = post(f"/api/v1/jobs/{job['id']}/approve/", {"plan_hash": forged}, user=reviewer, expect=409)
    assert "changed since you saw it" in answer["detail"] and forged[:16] in answer["detail"]
    assert Job.objects.get(pk=job["id"]).status == "proposed" and not Approval.objects.exists()
    assert handoffs == [] and live_engine.state()["fingerprint"] == before
    event = AuditEvent.objects.get(action="job.approve_refused")
    assert (event.actor, event.subject, event.payload["plan_hash"]) == (reviewer, f"job:{job['id']}", forged)
    assert event.payload["reason"] == answer["detail"] and verify_chain().first_broken is None  # every link holds


def test_a_failed_audit_write_fails_the_refusal_closed(token_client, monkeypatch, unchanged):
    import console.jobs.refusals as refusals

    def broken(**kwargs):
        raise RuntimeError("audit store down")

    monkeypatch.setattr(refusals, "record", broken)
    token_client.raise_request_exception = False
    response = token_client.post("/api/v1/jobs/", {"kind": "teleport", "target": CUT}, format="json")
    assert response.status_code == 500 and response.json()["code"] == "InternalError"
    assert not AuditEvent.objects.filter(action="job.propose_refused").exists()
