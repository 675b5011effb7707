"""Roles, CSRF and the review gate as an attacker meets them: a viewer cannot propose (API or page), session
POSTs without the CSRF token are refused, a token cannot approve its own user's job, and a tampered audit row
is reported by the API's verify."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from console.accounts.tokens import issue_token
from console.audit.models import AuditEvent
from console.jobs.models import Approval, Job

pytestmark = pytest.mark.django_db

BODY = {"kind": "cut", "target": {"cut": [8, 4, 4]}}


def _browser(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def _csrf_token(client: Client) -> str:
    client.get("/jobs/")
    return client.cookies["csrftoken"].value


def _token_client(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(user).secret}")
    return client


def test_a_viewer_cannot_propose_through_the_api(live_engine, viewer):
    response = _token_client(viewer).post("/api/v1/jobs/", BODY, format="json")
    assert response.status_code == 403 and "needs the operator role" in response.json()["detail"]
    assert not Job.objects.exists()


def test_a_viewer_cannot_propose_through_the_page(live_engine, viewer):
    browser = _browser(viewer)
    response = browser.post("/jobs/new/", {"kind": "cut", "cut": "8,4,4", "action": "propose",
                                           "csrfmiddlewaretoken": _csrf_token(browser)})
    assert response.status_code == 403 and not Job.objects.exists()


def test_a_page_post_without_the_csrf_token_is_refused(live_engine, operator):
    browser = _browser(operator)
    form = {"kind": "cut", "cut": "8,4,4", "action": "propose"}
    refused = browser.post("/jobs/new/", form)
    assert refused.status_code == 403 and b"CSRF" in refused.content and not Job.objects.exists()
    accepted = browser.post("/jobs/new/", {**form, "csrfmiddlewaretoken": _csrf_token(browser)})
    assert accepted.status_code == 302 and Job.objects.count() == 1  # the same form with its token goes through


def test_a_review_post_without_the_csrf_token_is_refused(proposed, reviewer, handoffs):
    job = proposed()
    browser = _browser(reviewer)
    refused = browser.post(f"/jobs/{job['id']}/approve/", {"plan_hash": job["plan_hash"]})
    assert refused.status_code == 403 and not Approval.objects.exists() and handoffs == []
    assert Job.objects.get(pk=job["id"]).status == "proposed"


def test_a_session_authenticated_api_post_needs_the_csrf_token(live_engine, operator):
    browser = _browser(operator)  # a logged-in browser's cookie, replayed by another site
    refused = browser.post("/api/v1/jobs/", BODY, content_type="application/json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"] and not Job.objects.exists()
    accepted = browser.post("/api/v1/jobs/", BODY, content_type="application/json",
                            HTTP_X_CSRFTOKEN=_csrf_token(browser))
    assert accepted.status_code == 201


def test_a_token_cannot_approve_its_own_users_job(live_engine, make_user, handoffs):
    both = make_user("operator", "reviewer")
    client = _token_client(both)
    job = client.post("/api/v1/jobs/", BODY, format="json").json()
    refused = client.post(f"/api/v1/jobs/{job['id']}/approve/", {"plan_hash": job["plan_hash"]}, format="json")
    assert refused.status_code == 403 and "cannot approve it" in refused.json()["detail"]
    assert Job.objects.get(pk=job["id"]).status == "proposed" and not Approval.objects.exists() and handoffs == []
    attempt = AuditEvent.objects.get(action="job.approve_refused")
    assert attempt.actor == both and attempt.payload["code"] == "NotAllowed"


def test_a_tampered_audit_row_is_reported_by_the_api(proposed, reviewer, handoffs):
    proposed()
    clean = _token_client(reviewer).get("/api/v1/audit/verify/").json()
    # Every link holds (recorded in the test's transaction, so never anchored: not "ok", for the anchor alone).
    assert clean["first_broken"] is None and clean["checked"] >= 1 and clean["anchor"] == "missing"
    target = AuditEvent.objects.get(action="job.proposed")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":  # the append-only trigger must be switched off to tamper at all
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER audit_auditevent_append_only")
        cursor.execute("UPDATE audit_auditevent SET actor_name = 'mallory' WHERE id = %s", [target.pk])
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER audit_auditevent_append_only")
    report = _token_client(reviewer).get("/api/v1/audit/verify/").json()
    assert report["ok"] is False and report["first_broken"] == target.seq and report["reason"]
