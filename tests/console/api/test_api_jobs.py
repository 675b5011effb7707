"""Jobs through the API against a real engine: propose, read, approve, reject, cancel, and the refusals."""

import pytest

from console.audit.models import AuditEvent
from console.jobs.models import Approval, Job

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"


def test_operator_proposes_a_job(proposed, operator):
    body = proposed()
    assert body["status"] == "proposed" and body["kind"] == "cut"
    assert len(body["plan_hash"]) == 64 and "pool_tokens" in body["prediction"]
    job = Job.objects.get(pk=body["id"])
    assert job.proposer == operator and job.plan_hash == body["plan_hash"]


def test_proposal_is_audited_with_the_request_id(live_engine, operator, post):
    body = post(JOBS, {"kind": "cut", "target": {"cut": _cut(live_engine)}}, user=operator, expect=201,
                HTTP_X_REQUEST_ID="api-test-req-1")
    event = AuditEvent.objects.get(action="job.proposed", subject=f"job:{body['id']}")
    assert event.request_id == "api-test-req-1"


def test_viewer_cannot_propose(live_engine, viewer, post):
    body = post(JOBS, {"kind": "cut", "target": {"cut": _cut(live_engine)}}, user=viewer, expect=403)
    assert "operator" in body["detail"]
    assert not Job.objects.exists()


def test_list_and_detail(proposed, viewer, get):
    job = proposed()
    listed = get(JOBS, user=viewer)
    assert [row["id"] for row in listed["results"]] == [job["id"]]
    assert get(f"{JOBS}{job['id']}/", user=viewer)["plan_hash"] == job["plan_hash"]


def test_unknown_job_is_404_with_a_message(viewer, get, post, reviewer):
    assert "no job 999" in get(f"{JOBS}999/", user=viewer, expect=404)["detail"]
    assert "no job 999" in post(f"{JOBS}999/approve/", {"plan_hash": "0" * 64}, user=reviewer, expect=404)["detail"]


@pytest.mark.parametrize("body, field", [
    ({"target": {"cut": [8, 4, 4]}}, "kind"),
    ({"kind": "cut"}, "target"),
    ({"kind": "teleport", "target": {}}, "kind"),
    ({"kind": "cut", "target": [8, 4, 4]}, "target"),
    ({"kind": 7, "target": {"cut": [8, 4, 4]}}, "kind"),
    ({"kind": "cut", "target": {"cut": [8, 4, 4]}, "incumbent_fingerprint": 5}, "incumbent_fingerprint"),
    ({"kind": "cut", "target": {"cut": [8, 4, 4]}, "colour": "red"}, "colour"),
])
def test_bad_bodies_are_400_naming_the_field(live_engine, operator, post, body, field):
    answer = post(JOBS, body, user=operator, expect=400)
    assert answer["field"] == field and field in answer["detail"]


def test_cut_of_the_wrong_sum_is_400_naming_the_target(live_engine, operator, post):
    answer = post(JOBS, {"kind": "cut", "target": {"cut": [8, 8, 8]}}, user=operator, expect=400)
    assert "cut" in answer["detail"] and answer["field"].startswith("target")


def test_a_body_that_is_not_json_is_400(live_engine, operator):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(operator)
    response = client.post(JOBS, "{not json", content_type="application/json")
    assert response.status_code == 400 and "JSON" in response.json()["detail"]


def test_self_approval_is_refused(make_user, proposed, post):
    both = make_user("operator", "reviewer", name="sam")
    job = proposed(user=both)
    answer = post(f"{JOBS}{job['id']}/approve/", {"plan_hash": job["plan_hash"]}, user=both, expect=403)
    assert "cannot approve" in answer["detail"]
    assert Job.objects.get(pk=job["id"]).status == "proposed"


def test_operator_cannot_approve(proposed, make_user, post):
    job = proposed()
    answer = post(f"{JOBS}{job['id']}/approve/", {"plan_hash": job["plan_hash"]}, user=make_user("operator"),
                  expect=403)
    assert "reviewer" in answer["detail"]
    assert not Approval.objects.filter(job_id=job["id"]).exists()  # refused before anything was written
    assert Job.objects.get(pk=job["id"]).status == "proposed"


def test_reviewer_approves_and_the_job_is_queued(proposed, reviewer, post, handoffs,
                                                 django_capture_on_commit_callbacks):
    job = proposed()
    with django_capture_on_commit_callbacks(execute=True):
        answer = post(f"{JOBS}{job['id']}/approve/", {"plan_hash": job["plan_hash"]}, user=reviewer)
    assert answer["status"] == "queued"
    assert handoffs == [job["id"]]


def test_approving_a_plan_you_did_not_see_is_409(proposed, reviewer, post, handoffs):
    job = proposed()
    answer = post(f"{JOBS}{job['id']}/approve/", {"plan_hash": "0" * 64}, user=reviewer, expect=409)
    assert "changed" in answer["detail"] and handoffs == []


def test_approve_with_a_plan_hash_of_the_wrong_type_is_400(proposed, reviewer, post):
    job = proposed()
    answer = post(f"{JOBS}{job['id']}/approve/", {"plan_hash": ["x"]}, user=reviewer, expect=400)
    assert answer["field"] == "plan_hash" and answer["detail"].startswith("plan_hash: ")


@pytest.mark.parametrize("body", [{}, {"plan_hash": ""}, {"plan_hash": None}])
def test_approve_without_the_plan_hash_is_400_naming_it_and_audited(proposed, reviewer, post, handoffs, body):
    job = proposed()
    answer = post(f"{JOBS}{job['id']}/approve/", body, user=reviewer, expect=400)
    assert answer["field"] == "plan_hash" and answer["detail"].startswith("plan_hash: ")
    assert Job.objects.get(pk=job["id"]).status == "proposed" and handoffs == []
    refused = AuditEvent.objects.get(action="job.approve_refused", subject=f"job:{job['id']}")
    assert refused.actor == reviewer and "plan_hash" in refused.payload["reason"]


def test_list_filters_by_status(proposed, reviewer, viewer, post, get):
    kept, rejected = proposed(), proposed()
    post(f"{JOBS}{rejected['id']}/reject/", {}, user=reviewer)
    assert [row["id"] for row in get(JOBS, {"status": "proposed"}, user=viewer)["results"]] == [kept["id"]]
    assert [row["id"] for row in get(JOBS, {"status": "rejected"}, user=viewer)["results"]] == [rejected["id"]]
    assert get(JOBS, {"status": "queued"}, user=viewer)["results"] == []
    both = get(JOBS, {"status": "rejected, proposed"}, user=viewer)
    assert sorted(row["id"] for row in both["results"]) == sorted([kept["id"], rejected["id"]]) and both["count"] == 2
    assert get(JOBS, {"status": ""}, user=viewer)["count"] == 2  # an empty filter is no filter, as on the page


@pytest.mark.parametrize("value", ["done", "PROPOSED", "proposed,nope", "active"])
def test_list_with_an_unknown_status_is_400_naming_the_allowed_values(viewer, get, value):
    answer = get(JOBS, {"status": value}, user=viewer, expect=400)
    assert answer["field"] == "status"
    assert all(status in answer["detail"] for status in ("proposed", "rolled_back", "cancelled"))


def test_reviewer_rejects(proposed, reviewer, post):
    job = proposed()
    answer = post(f"{JOBS}{job['id']}/reject/", {"reason": "not today"}, user=reviewer)
    assert answer["status"] == "rejected" and "not today" in answer["error"]
    approve = {"plan_hash": job["plan_hash"]}
    assert "rejected" in post(f"{JOBS}{job['id']}/approve/", approve, user=reviewer, expect=409)["detail"]


def test_proposer_cancels_and_others_cannot(proposed, operator, make_user, post):
    job = proposed()
    assert "proposer" in post(f"{JOBS}{job['id']}/cancel/", {}, user=make_user("operator"), expect=403)["detail"]
    assert post(f"{JOBS}{job['id']}/cancel/", {}, user=operator)["status"] == "cancelled"
    assert post(f"{JOBS}{job['id']}/cancel/", {}, user=operator, expect=409)["detail"]


def test_engine_down_is_503_with_a_message(operator, post, settings):
    settings.ENGINE_URL = "http://127.0.0.1:9"
    answer = post(JOBS, {"kind": "cut", "target": {"cut": [8, 4, 4]}}, user=operator, expect=503)
    assert "plan" in answer["detail"]


def _cut(engine):
    from tests.support.jobs import other_cut

    return other_cut(engine)


def test_an_unexpected_error_is_json_with_the_request_id(proposed, reviewer, post, monkeypatch):
    from console.jobs import lifecycle

    job = proposed()

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(lifecycle, "reject", broken)
    answer = post(f"{JOBS}{job['id']}/reject/", {}, user=reviewer, expect=500, HTTP_X_REQUEST_ID="api-boom-1")
    assert answer["code"] == "InternalError" and answer["request_id"] == "api-boom-1"
