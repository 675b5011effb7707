"""GET /api/v1/metrics/ beyond the calibration gauges (console/calibration/metrics.py): jobs, speed verdicts, layout
observations and the audit chain, read from the database at each scrape."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from console.audit.services import record
from console.jobs.models import Job, LayoutObservation
from tests.support.calibration import executed_job
from tests.support.metrics import scrape

pytestmark = pytest.mark.django_db

URL = "/api/v1/metrics/"


def _job(status: str, verdict: str = "") -> Job:
    job = executed_job([7, 5, 4], [8, 4, 4])
    Job.objects.filter(pk=job.pk).update(status=status, speed_verdict=verdict)
    return job


def test_jobs_count_by_status_and_final_verdict(browse, viewer, dead_engine):
    client = browse(viewer)
    before = scrape(client, URL)
    assert before[("seam_jobs_finished_total", (("status", "failed"),))] == 0  # there from the start, at zero
    _job("failed")
    _job("failed")
    _job("succeeded", "missed")
    _job("succeeded", "met")
    _job("succeeded", "pending")  # not final: no verdict counted yet
    _job("queued")
    after = scrape(client, URL)
    assert after[("seam_jobs_finished_total", (("status", "failed"),))] == 2
    assert after[("seam_jobs_finished_total", (("status", "succeeded"),))] == 3
    assert after[("seam_jobs", (("status", "queued"),))] == 1 and after[("seam_jobs", (("status", "running"),))] == 0
    assert after[("seam_job_speed_verdicts_total", (("verdict", "missed"),))] == 1
    assert after[("seam_job_speed_verdicts_total", (("verdict", "met"),))] == 1
    assert ("seam_job_speed_verdicts_total", (("verdict", "pending"),)) not in after


def test_an_unexplained_layout_change_is_counted(browse, viewer, dead_engine):
    client = browse(viewer)
    assert scrape(client, URL)[("seam_layout_observations_total", (("cause", "unexplained"),))] == 0
    for cause in ("first_seen", "unexplained"):
        LayoutObservation.objects.create(engine_url="http://engine", fingerprint="f" * 16, cut=[7, 5, 4], shape={},
                                         cause=cause)
    samples = scrape(client, URL)
    assert samples[("seam_layout_observations_total", (("cause", "unexplained"),))] == 1
    assert samples[("seam_layout_observations_total", (("cause", "first_seen"),))] == 1
    assert samples[("seam_layout_observations_total", (("cause", "job"),))] == 0


def _rewrite_subject(seq: int) -> None:
    """What an attacker with the database but not the key does: change an event in place."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER audit_auditevent_append_only")
        cursor.execute("UPDATE audit_auditevent SET subject = 'job:999' WHERE seq = %s", [seq])
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER audit_auditevent_append_only")


def test_a_tampered_audit_chain_is_reported(browse, viewer, dead_engine, django_capture_on_commit_callbacks):
    client = browse(viewer)
    for n in (1, 2):
        with django_capture_on_commit_callbacks(execute=True), transaction.atomic():  # anchored, as after a commit
            record(actor=None, action="test.metrics", subject=f"job:{n}", payload={"n": n})
    samples = scrape(client, URL)
    assert samples[("seam_audit_chain_verified", ())] == 1 and samples[("seam_audit_chain_anchored", ())] == 1
    assert samples[("seam_audit_events", ())] == 2
    _rewrite_subject(2)
    samples = scrape(client, URL)
    assert samples[("seam_audit_chain_verified", ())] == 0
    assert samples[("seam_audit_events", ())] == 1  # the links before the broken one
