"""New job page: the engine's prediction for a prefilled plan, proposing through the service layer, the shape form
at the running shape with the longest context that fits when a shape is refused, and a scheduled proposal."""

import re
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from console.audit.models import AuditEvent
from console.jobs.models import Job
from tests.support.jobs import other_cut

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
    # The per-rank budget in binary units, the cut as the other pages write it.
    assert re.search(r'<td class="num">\d+\.\d (KiB|MiB|GiB)</td>', page)
    assert not re.search(r"\d (KB|MB|GB|bytes)\b", page)
    assert f'<p>Cut <span class="mono">{" · ".join(map(str, cut))}</span>' in page


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


# --- the shape form: the running shape, and the longest context that fits -------------------------------------

def field_value(page: str, name: str) -> str:
    value = re.search(r'value="([^"]*)"', re.search(rf'<input[^>]*name="{name}"[^>]*>', page).group(0))
    return value.group(1) if value else ""


@pytest.mark.parametrize("query", ["?kind=shape", ""])
def test_the_shape_fields_start_at_the_running_shape(browse, operator, live_engine, query):
    shape = live_engine.state()["shape"]
    response = browse(operator).get(f"/jobs/new/{query}")
    page = response.content.decode()
    assert response.status_code == 200 and 'data-testid="prediction-pool"' not in page  # nothing asked yet
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        assert field_value(page, name) == str(shape[name]), name
    assert field_value(page, "kv_dtype") == (shape["kv_dtype"] or "")
    assert ('<option value="shape" selected>' in page) == (query == "?kind=shape")


def the_engines_longest(engine, target: dict) -> int:
    """The longest max_model_len the engine itself accepts with `target`'s other fields, by asking it."""
    low, high = 1, target["max_model_len"]  # the engine refuses `high`; bisect to the last length it accepts
    while low < high:
        middle = (low + high + 1) // 2
        if engine.plan("shape", {**target, "max_model_len": middle})["feasible"]:
            low = middle
        else:
            high = middle - 1
    return low


def test_an_infeasible_shape_is_answered_with_the_longest_that_fits_and_a_link(browse, post_form, operator,
                                                                               live_engine):
    asked = {"max_num_seqs": 96, "max_model_len": 4096}  # the pool left by 96 sequences' state holds less than that
    assert not live_engine.plan("shape", asked)["feasible"]
    client = browse(operator)
    response = post_form(client, "/jobs/new/", {"kind": "shape", **asked, "action": "propose"})
    page = response.content.decode()
    assert response.status_code == 422 and not Job.objects.exists()
    longest = int(re.search(r'data-testid="largest-max-model-len" data-value="(\d+)"', page).group(1))
    assert longest == the_engines_longest(live_engine, asked) < 4096
    cut = comma(live_engine.state()["cut"])
    assert any(f"the largest max_model_len that fits at cut {cut} with the other shape fields as asked is {longest}"
               in error for error in form_errors(page))
    link = re.search(r'href="([^"]+)" data-testid="largest-max-model-len-link"', page).group(1).replace("&amp;", "&")
    assert link.startswith("/jobs/new/?") and f"max_model_len={longest}" in link and "max_num_seqs=96" in link
    followed = client.get(link).content.decode()  # one click: the prefilled form and the engine's prediction
    assert 'data-testid="prediction-pool"' in followed and f'value="{longest}"' in followed


def test_the_api_refusal_of_a_shape_carries_the_longest_that_fits(operator, live_engine):
    asked = {"max_num_seqs": 96, "max_model_len": 4096}
    client = APIClient()
    client.force_authenticate(operator)
    response = client.post("/api/v1/jobs/", {"kind": "shape", "target": asked}, format="json")
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert f"the largest max_model_len that fits at cut {comma(live_engine.state()['cut'])} with the other shape " \
           f"fields as asked is {the_engines_longest(live_engine, asked)}" in detail


# --- a scheduled proposal ------------------------------------------------------------------------------------

def test_not_before_on_the_form_is_read_in_the_servers_time_zone(browse, post_form, operator, live_engine, settings):
    settings.TIME_ZONE = "Asia/Kolkata"  # UTC+05:30 all year
    local = (timezone.now() + timedelta(days=2)).astimezone(ZoneInfo("Asia/Kolkata")).replace(second=0, microsecond=0)
    response = post_form(browse(operator), "/jobs/new/", {"kind": "cut", "cut": comma(other_cut(live_engine)),
                                                          "not_before": local.strftime("%Y-%m-%dT%H:%M"),
                                                          "action": "propose"})
    assert response.status_code == 302
    assert Job.objects.get().not_before == local  # the same instant: 05:30 ahead of UTC


def test_a_past_not_before_on_the_form_is_refused_naming_it(browse, post_form, operator, live_engine):
    response = post_form(browse(operator), "/jobs/new/", {"kind": "cut", "cut": comma(other_cut(live_engine)),
                                                          "not_before": "2001-01-01T00:00", "action": "propose"})
    assert response.status_code == 400 and not Job.objects.exists()
    assert any(error.startswith("not_before: ") and "in the past" in error
               for error in form_errors(response.content.decode()))
