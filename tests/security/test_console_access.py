"""Who gets what from the console, as an attacker with a login but no console role meets it: no telemetry or job
over the websocket, no write through the API or the pages, and every write so refused leaves an audit event
(committed, though the request was refused). An approval is bound to the plan it names on both doors."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from console.audit.models import AuditEvent
from console.jobs.models import Approval, Job
from tests.support.live import live_socket, login_headers, request, run

pytestmark = pytest.mark.django_db(transaction=True)

# (path, the audit subject of a refused POST to it): a job's id where the path names one, else the path.
API_WRITES = [("/api/v1/jobs/", "/api/v1/jobs/"), ("/api/v1/jobs/7/approve/", "job:7"),
              ("/api/v1/jobs/7/reject/", "job:7"), ("/api/v1/jobs/7/cancel/", "job:7")]
PAGE_WRITES = [("/jobs/new/", "/jobs/new/"), ("/jobs/7/approve/", "job:7"), ("/jobs/7/reject/", "job:7"),
               ("/jobs/7/cancel/", "job:7")]


def _api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _page(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("groups", [["telemetry"], ["job-7"]])
def test_a_user_without_a_role_gets_no_telemetry_or_job_over_the_websocket(live_settings, make_user, groups):
    headers = login_headers(make_user())

    async def scenario():
        async with live_socket(headers) as communicator:
            reply = await request(communicator, {"action": "subscribe", "groups": groups})
            assert reply["type"] == "error" and reply["refused"] == groups, reply
            fetched = await request(communicator, {"action": "fetch", "after_seq": 0})
            assert fetched["type"] == "error", fetched
    run(scenario)


@pytest.mark.parametrize("path, subject", API_WRITES)
def test_an_api_write_by_a_user_without_a_role_is_refused_and_audited(make_user, path, subject):
    nobody = make_user()
    response = _api(nobody).post(path, {"kind": "cut", "target": {"cut": [8, 4, 4]}, "plan_hash": "0" * 64},
                                 format="json")
    assert response.status_code == 403 and "console roles" in response.json()["detail"]
    _assert_refusal_recorded(nobody, "POST", path, subject)


@pytest.mark.parametrize("path, subject", PAGE_WRITES)
def test_a_page_write_by_a_user_without_a_role_is_refused_and_audited(make_user, path, subject):
    nobody = make_user()
    response = _page(nobody).post(path, {"kind": "cut", "cut": "8,4,4", "action": "propose", "plan_hash": "0" * 64})
    assert response.status_code == 403
    _assert_refusal_recorded(nobody, "POST", path, subject)


def test_a_refused_read_is_not_an_audit_event(make_user):
    nobody = make_user()
    # The browsable API asks the permission again with a pretend POST to decide whether to draw a form: that is
    # no attempt of the user's, and must not be recorded as one.
    assert _api(nobody).get("/api/v1/jobs/", HTTP_ACCEPT="text/html").status_code == 403
    assert _page(nobody).get("/jobs/").status_code == 403
    assert not AuditEvent.objects.filter(action="access.refused").exists()


def test_a_page_proposal_by_a_viewer_is_audited_as_the_api_s_is(live_engine, viewer):
    assert _page(viewer).post("/jobs/new/", {"kind": "cut", "cut": "8,4,4", "action": "propose"}).status_code == 403
    assert _api(viewer).post("/api/v1/jobs/", {"kind": "cut", "target": {"cut": [8, 4, 4]}},
                             format="json").status_code == 403
    refused = AuditEvent.objects.filter(action="job.propose_refused").order_by("seq")
    assert [(event.actor, event.payload["code"]) for event in refused] == [(viewer, "NotAllowed")] * 2
    assert not Job.objects.exists()


def test_an_approval_without_the_plan_hash_is_refused_and_audited_on_both_doors(proposed, reviewer, handoffs):
    job = proposed()
    answer = _api(reviewer).post(f"/api/v1/jobs/{job['id']}/approve/", {}, format="json")
    assert answer.status_code == 400 and answer.json()["field"] == "plan_hash"
    page = _page(reviewer).post(f"/jobs/{job['id']}/approve/", {}, follow=True)
    assert b"no plan_hash" in page.content
    assert Job.objects.get(pk=job["id"]).status == "proposed" and not Approval.objects.exists() and handoffs == []
    refused = AuditEvent.objects.filter(action="job.approve_refused", subject=f"job:{job['id']}")
    assert [(event.actor, event.payload["code"]) for event in refused] == [(reviewer, "ValidationError")] * 2


def _assert_refusal_recorded(user, method: str, path: str, subject: str) -> None:
    event = AuditEvent.objects.get(action="access.refused")  # committed: this test runs without a transaction
    assert (event.actor, event.actor_name, event.subject) == (user, user.get_username(), subject)
    assert event.payload["method"] == method and event.payload["path"] == path
    assert "console roles" in event.payload["reason"]
    assert not Job.objects.exists() and not Approval.objects.exists()
