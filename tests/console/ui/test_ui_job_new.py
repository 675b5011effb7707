"""New job page: the engine's prediction for a prefilled plan, and proposing through the service layer."""

import re

import pytest
from job_helpers import other_cut  # importable: the job tests' conftest puts its folder on sys.path

from console.audit.models import AuditEvent
from console.jobs.models import Job

pytestmark = pytest.mark.django_db


def comma(cut) -> str:
    return ",".join(map(str, cut))


def form_errors(page: str) -> list[str]:
    return re.findall(r'data-testid="form-error"[^>]*>([^<]+)<', page)


def test_a_prefilled_cut_shows_the_engines_prediction(browse, operator, live_engine):
    cut = other_cut(live_engine)
    planned = live_engine.plan("cut", {"cut": cut})
    page = browse(operator).get(f"/jobs/new/?kind=cut&cut={comma(cut)}").content.decode()
    tokens = re.search(r'data-testid="prediction-pool" data-tokens="(\d+)"', page).group(1)
    assert int(tokens) == planned["plan"]["predicted"]["pool_tokens"]
    assert f'value="{comma(cut)}"' in page and '<option value="cut" selected>' in page
    fingerprint = live_engine.state()["fingerprint"]
    assert f'name="incumbent_fingerprint" value="{fingerprint}"' in page
    assert 'data-testid="propose-submit"' in page


def test_proposing_through_the_form_creates_the_job_through_the_service(browse, post_form, operator, live_engine):
    cut = other_cut(live_engine)
    client = browse(operator)
    response = post_form(client, "/jobs/new/", {"kind": "cut", "cut": comma(cut), "action": "propose",
                                                "incumbent_fingerprint": live_engine.state()["fingerprint"]})
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert (job.kind, job.target, job.status, job.proposer) == ("cut", {"cut": cut}, "proposed", operator)
    assert job.prediction["pool_tokens"] == live_engine.plan("cut", {"cut": cut})["plan"]["predicted"]["pool_tokens"]
    event = AuditEvent.objects.get(action="job.proposed")
    assert (event.subject, event.actor_name, event.payload["plan_hash"]) == (f"job:{job.pk}", "olga", job.plan_hash)


def test_preview_by_post_shows_the_prediction_and_stores_nothing(browse, post_form, operator, live_engine):
    cut = other_cut(live_engine)
    response = post_form(browse(operator), "/jobs/new/", {"kind": "cut", "cut": comma(cut), "action": "preview"})
    assert response.status_code == 200 and 'data-testid="prediction-pool"' in response.content.decode()
    assert not Job.objects.exists()


def test_a_viewer_sees_no_form_and_gets_403_on_post(browse, post_form, viewer, live_engine):
    client = browse(viewer)
    page = client.get("/jobs/new/").content.decode()
    assert "propose-submit" not in page and "needs the operator role" in page
    response = post_form(client, "/jobs/new/", {"kind": "cut", "cut": comma(other_cut(live_engine)),
                                                "action": "propose"})
    assert response.status_code == 403 and "operator role" in response.content.decode()
    assert not Job.objects.exists()


def test_a_reviewer_cannot_propose_either(browse, post_form, reviewer, live_engine):
    response = post_form(browse(reviewer), "/jobs/new/", {"kind": "cut", "cut": comma(other_cut(live_engine)),
                                                          "action": "propose"})
    assert response.status_code == 403 and not Job.objects.exists()


@pytest.mark.parametrize("cut, expected", [("8,x,4", "expected whole numbers"), ("", "name the layers per rank")])
def test_a_malformed_cut_is_shown_on_the_form(browse, post_form, operator, live_engine, cut, expected):
    response = post_form(browse(operator), "/jobs/new/", {"kind": "cut", "cut": cut, "action": "propose"})
    assert response.status_code == 400
    assert any(expected in error for error in form_errors(response.content.decode()))
    assert not Job.objects.exists()
    refused = AuditEvent.objects.get(action="job.propose_refused")
    assert refused.actor_id == operator.pk and expected in refused.payload["reason"]


def test_an_infeasible_cut_shows_the_engines_reasons(browse, post_form, operator, live_engine):
    response = post_form(browse(operator), "/jobs/new/", {"kind": "cut", "cut": "1,1,14", "action": "propose"})
    assert response.status_code == 422
    assert any("infeasible" in error and "arming floor" in error for error in form_errors(response.content.decode()))
    assert not Job.objects.exists()


def test_a_cut_for_the_wrong_number_of_ranks_is_refused_with_the_field(browse, post_form, operator, live_engine):
    response = post_form(browse(operator), "/jobs/new/", {"kind": "cut", "cut": "8,8", "action": "propose"})
    assert response.status_code == 400
    assert any("target.cut" in error for error in form_errors(response.content.decode()))
    assert not Job.objects.exists()


def test_a_layout_that_moved_since_the_prediction_is_refused(browse, post_form, operator, live_engine):
    response = post_form(browse(operator), "/jobs/new/", {"kind": "cut", "cut": comma(other_cut(live_engine)),
                                                          "action": "propose", "incumbent_fingerprint": "feedface"})
    assert response.status_code == 409
    assert any("plan again" in error for error in form_errors(response.content.decode()))
    assert not Job.objects.exists()


def test_a_shape_change_is_proposed_with_its_fields(browse, post_form, operator, live_engine):
    seqs = live_engine.state()["shape"]["max_num_seqs"]
    response = post_form(browse(operator), "/jobs/new/", {"kind": "shape", "max_num_seqs": seqs + 1,
                                                          "action": "propose"})
    assert response.status_code == 302
    assert Job.objects.get().target["max_num_seqs"] == seqs + 1


def test_an_unreachable_engine_is_said_clearly(browse, post_form, operator, settings):
    settings.ENGINE_URL = "http://127.0.0.1:1"
    client = browse(operator)
    response = client.get("/jobs/new/?kind=cut&cut=8,4,4")
    page = response.content.decode()
    assert response.status_code == 503
    assert 'data-testid="engine-unreachable"' in page and "engine unreachable at http://127.0.0.1:1" in page
    assert 'data-testid="prediction-pool"' not in page
    response = post_form(client, "/jobs/new/", {"kind": "cut", "cut": "8,4,4", "action": "propose"})
    assert response.status_code == 503 and "engine unreachable" in " ".join(form_errors(response.content.decode()))
    assert not Job.objects.exists()
