"""Jobs list: newest first, filterable by status, a "New job" link for operators only."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from console.jobs import lifecycle
from tests.support.jobs import other_cut

pytestmark = pytest.mark.django_db


def listed(page: str) -> list[int]:
    return [int(job_id) for job_id in re.findall(r'data-testid="job-row" data-job-id="(\d+)"', page)]


def test_jobs_are_listed_newest_first_and_filter_by_status(browse, viewer, reviewer, propose_cut):
    first, second = propose_cut(), propose_cut()
    lifecycle.reject(reviewer, first, reason="no")
    client = browse(viewer)
    assert listed(client.get("/jobs/").content.decode()) == [second.pk, first.pk]
    assert listed(client.get("/jobs/?status=rejected").content.decode()) == [first.pk]
    assert listed(client.get("/jobs/?status=proposed").content.decode()) == [second.pk]
    assert listed(client.get("/jobs/?status=nonsense").content.decode()) == [second.pk, first.pk]


def test_only_operators_are_offered_a_new_job(browse, viewer, operator, reviewer):
    assert 'data-testid="new-job-link"' in browse(operator).get("/jobs/").content.decode()
    assert 'data-testid="new-job-link"' not in browse(viewer).get("/jobs/").content.decode()
    assert 'data-testid="new-job-link"' not in browse(reviewer).get("/jobs/").content.decode()


def test_an_empty_list_says_so(browse, viewer):
    assert "No jobs" in browse(viewer).get("/jobs/").content.decode()


def test_a_scheduled_job_shows_when_it_may_run(browse, viewer, operator, live_engine, propose_cut):
    when = (timezone.now() + timedelta(hours=5)).replace(microsecond=0)
    scheduled = lifecycle.propose(operator, {"kind": "cut", "target": {"cut": other_cut(live_engine)},
                                             "not_before": when.isoformat()})
    plain = propose_cut()
    client = browse(viewer)
    page = client.get("/jobs/").content.decode()
    shown = dict(re.findall(r'data-job-id="(\d+)">.*?data-testid="job-not-before">(.*?)</td>', page, re.S))
    assert when.strftime("%Y-%m-%d %H:%M:%S") in shown[str(scheduled.pk)] and shown[str(plain.pk)] == "—"
    detail = client.get(f"/jobs/{scheduled.pk}/").content.decode()
    assert re.search(rf'data-testid="job-not-before"><time datetime="{re.escape(when.isoformat())}">', detail)
