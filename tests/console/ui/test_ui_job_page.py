"""Job page: what it shows, who is offered which button, and the buttons going through the service layer."""

import re

import pytest

from console.jobs.models import Approval, Job
from tests.support.jobs import wait_for_end

pytestmark = pytest.mark.django_db


def buttons(page: str) -> set[str]:
    return set(re.findall(r'data-testid="(approve-button|reject-button|cancel-button)"', page))


def messages(page: str) -> list[str]:
    return re.findall(r'data-testid="message"[^>]*>([^<]+)<', page)


def test_the_page_shows_the_job(browse, viewer, propose_cut):
    job = propose_cut()
    page = browse(viewer).get(f"/jobs/{job.pk}/").content.decode()
    assert f'<main id="job" data-job-id="{job.pk}"' in page
    assert re.search(r'data-testid="job-status"[^>]*>proposed<', page)
    assert f'data-testid="plan-hash">{job.plan_hash}<' in page
    assert f'data-testid="predicted-pool" data-tokens="{job.prediction["pool_tokens"]}"' in page
    assert 'data-testid="measured-pool" id="measured-pool" data-tokens=""' in page
    assert re.search(r'<progress data-testid="job-progress" id="job-progress" max="1" value="0\.0+">', page)
    assert 'src="/static/js/job.js"' in page  # live while the job is active


def test_a_missing_job_is_404(browse, viewer):
    assert browse(viewer).get("/jobs/999999/").status_code == 404


def test_the_proposer_sees_cancel_but_no_approve(browse, operator, propose_cut):
    job = propose_cut()
    assert buttons(browse(operator).get(f"/jobs/{job.pk}/").content.decode()) == {"cancel-button"}


def test_a_reviewer_sees_approve_and_reject_with_the_hash_shown(browse, reviewer, propose_cut):
    job = propose_cut()
    page = browse(reviewer).get(f"/jobs/{job.pk}/").content.decode()
    assert buttons(page) == {"approve-button", "reject-button"}
    assert f'<input type="hidden" name="plan_hash" value="{job.plan_hash}">' in page


def test_a_viewer_sees_no_button(browse, viewer, propose_cut):
    assert buttons(browse(viewer).get(f"/jobs/{propose_cut().pk}/").content.decode()) == set()


def test_a_proposer_who_is_also_a_reviewer_is_offered_no_approve_and_is_refused(browse, post_form, make_user,
                                                                                 propose_cut):
    both = make_user("operator", "reviewer", name="otto")
    job = propose_cut(user=both)
    client = browse(both)
    assert buttons(client.get(f"/jobs/{job.pk}/").content.decode()) == {"cancel-button"}
    response = post_form(client, f"/jobs/{job.pk}/approve/", {"plan_hash": job.plan_hash})
    assert response.status_code == 403 and "cannot approve it" in response.content.decode()
    assert not Approval.objects.exists() and Job.objects.get(pk=job.pk).status == "proposed"


def test_approving_through_the_page_with_the_hash_shown_queues_the_job(browse, post_form, reviewer, propose_cut,
                                                                       handoffs):
    job = propose_cut()
    client = browse(reviewer)
    response = post_form(client, f"/jobs/{job.pk}/approve/", {"plan_hash": job.plan_hash}, follow=True)
    assert response.redirect_chain == [(f"/jobs/{job.pk}/", 302)]
    assert Job.objects.get(pk=job.pk).status == "queued"
    approval = Approval.objects.get()
    assert (approval.reviewer, approval.plan_hash) == (reviewer, job.plan_hash)
    page = response.content.decode()
    assert any(f"You approved plan {job.plan_hash[:16]}" in message for message in messages(page))
    assert buttons(page) == set()


def test_a_stale_hash_is_refused_with_a_message(browse, post_form, reviewer, propose_cut):
    job = propose_cut()
    stale = "0" * 64
    response = post_form(browse(reviewer), f"/jobs/{job.pk}/approve/", {"plan_hash": stale}, follow=True)
    assert any("changed since you saw it" in message for message in messages(response.content.decode()))
    assert Job.objects.get(pk=job.pk).status == "proposed" and not Approval.objects.exists()


def test_an_approval_without_a_hash_is_refused(browse, post_form, reviewer, propose_cut):
    job = propose_cut()
    response = post_form(browse(reviewer), f"/jobs/{job.pk}/approve/", {}, follow=True)
    assert any("carried no plan_hash" in message for message in messages(response.content.decode()))
    assert Job.objects.get(pk=job.pk).status == "proposed" and not Approval.objects.exists()


@pytest.mark.parametrize("action", ["approve", "reject"])
def test_a_viewer_posting_a_review_gets_403(browse, post_form, viewer, propose_cut, action):
    job = propose_cut()
    response = post_form(browse(viewer), f"/jobs/{job.pk}/{action}/", {"plan_hash": job.plan_hash})
    assert response.status_code == 403 and "reviewer role" in response.content.decode()
    assert Job.objects.get(pk=job.pk).status == "proposed"


def test_rejecting_through_the_page(browse, post_form, reviewer, propose_cut):
    job = propose_cut()
    response = post_form(browse(reviewer), f"/jobs/{job.pk}/reject/", {"reason": "not tonight"}, follow=True)
    job.refresh_from_db()
    assert (job.status, job.error) == ("rejected", "rejected by rita: not tonight")
    assert any("You rejected job" in message for message in messages(response.content.decode()))


def test_the_proposer_cancels_and_nobody_else_may(browse, post_form, make_user, operator, propose_cut):
    job = propose_cut()
    response = post_form(browse(make_user("operator", name="other-op")), f"/jobs/{job.pk}/cancel/")
    assert response.status_code == 403 and Job.objects.get(pk=job.pk).status == "proposed"
    response = post_form(browse(operator), f"/jobs/{job.pk}/cancel/", follow=True)
    assert Job.objects.get(pk=job.pk).status == "cancelled"
    assert buttons(response.content.decode()) == set()


def test_a_second_cancel_is_refused_with_a_message(browse, post_form, operator, propose_cut):
    job = propose_cut()
    client = browse(operator)
    post_form(client, f"/jobs/{job.pk}/cancel/")
    response = post_form(client, f"/jobs/{job.pk}/cancel/", follow=True)
    assert any("only a job that has not started can be cancelled" in message
               for message in messages(response.content.decode()))


def test_review_actions_need_post(browse, reviewer, propose_cut):
    job = propose_cut()
    assert browse(reviewer).get(f"/jobs/{job.pk}/approve/").status_code == 405
    assert Job.objects.get(pk=job.pk).status == "proposed"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_approved_job_runs_and_the_page_shows_predicted_and_measured(browse, post_form, reviewer, propose_cut,
                                                                         celery_worker):
    job = propose_cut()
    post_form(browse(reviewer), f"/jobs/{job.pk}/approve/", {"plan_hash": job.plan_hash})
    assert wait_for_end(job.pk).status == "succeeded", celery_worker.output[-20:]
    page = browse(reviewer).get(f"/jobs/{job.pk}/").content.decode()
    predicted = re.search(r'data-testid="predicted-pool" data-tokens="(\d+)"', page).group(1)
    measured = re.search(r'data-testid="measured-pool" id="measured-pool" data-tokens="(\d+)"', page).group(1)
    assert predicted == measured == str(job.prediction["pool_tokens"])
    assert re.search(r'data-testid="job-status"[^>]*>succeeded<', page)
    assert re.search(r'<progress data-testid="job-progress" id="job-progress" max="1" value="1\.0+">', page)
    assert 'src="/static/js/job.js"' not in page  # a finished job does not subscribe



def test_an_id_too_long_for_the_database_is_404_not_an_overflow(browse, post_form, reviewer):
    client = browse(reviewer)
    assert client.get("/jobs/99999999999999999999999/").status_code == 404
    assert post_form(client, "/jobs/99999999999999999999999/approve/", {"plan_hash": "x"}).status_code == 404


def test_a_rank_without_attention_layers_compares_no_kv_tokens():
    from types import SimpleNamespace

    from console.ui.views.jobs import _comparison

    job = SimpleNamespace(
        prediction={"ranks": [{"rank": 0, "name": "a", "used": 8048, "attention_layers": 3, "weights": 10},
                              {"rank": 1, "name": "b", "used": 0, "attention_layers": 0, "weights": 5}]},
        measured={"ranks": [{"rank": 0, "kv_pool_tokens": 8048, "weights_bytes": 10},
                            {"rank": 1, "kv_pool_tokens": 8048, "weights_bytes": 5}]})
    rows = _comparison(job)
    assert [(row["predicted_tokens"], row["measured_tokens"]) for row in rows] == [(8048, 8048), (None, None)]


def test_byte_counts_are_binary_units(browse, viewer):
    """The per-rank budget table (shared with the proposal page) and the predicted-vs-measured weights in MiB/GiB,
    never Django's KB/MB."""
    ranks = [{"rank": 0, "name": "big", "layers": [0, 7], "attention_layers": 2, "weights": 12 * 2**30 + 2**29,
              "state": 3 * 2**20, "rest": 820 * 2**20, "floor": 1536, "allowed": 9136, "used": 9136, "slack": 0}]
    job = Job.objects.create(kind="cut", target={"cut": [8]}, plan={}, plan_hash="0" * 64, proposer_name="olga",
                             prediction={"cut": [8], "pool_tokens": 9136, "ranks": ranks}, status="succeeded",
                             measured={"pool_tokens": 9136, "ranks": [{"rank": 0, "kv_pool_tokens": 9136,
                                                                       "weights_bytes": 12 * 2**30}]})
    page = browse(viewer).get(f"/jobs/{job.pk}/").content.decode()
    cells = re.findall(r'<td class="num">([^<]*)</td>', page)
    assert [cell for cell in cells if "iB" in cell][-4:] == ["12.5 GiB", "3.0 MiB", "820.0 MiB", "1.5 KiB"]
    assert "12.0 GiB" in cells  # measured weights
    assert not re.search(r"\d (KB|MB|GB|bytes)\b", page)
