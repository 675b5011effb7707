"""Jobs judged on speed (console.jobs.verdicts): a succeeded job's measured speedup against its predicted one, judged
by the noise floor the prediction was made with, once the first measurement of the new layout completes it.

Stage times are crafted as in test_predictions.py (calibration_helpers.stages: linear, no fixed cost): the job moves
8,4,4 (16 ms pipelined) to 9,4,3, predicted 18 ms pipelined, x0.8889, judged by the rig's 14.1% floor."""

from __future__ import annotations

import json

import pytest

from console.audit.models import AuditEvent
from console.calibration.models import JobPrediction
from console.jobs import verdicts, webhooks
from console.jobs.models import Job
from tests.support.calibration import end_job, executed_job, measurement, stages, state_of

pytestmark = pytest.mark.django_db

PREDICTED = 16.0 / 18.0


@pytest.fixture
def measured(seed):
    for cut in ([7, 5, 4], [8, 5, 3], [8, 4, 4]):
        seed(cut, stages(cut))


def _ended(before=(8, 4, 4), after=(9, 4, 3)) -> tuple[Job, JobPrediction]:
    job = executed_job(list(before), list(after))
    return job, end_job(job, state_of(measurement(list(after), None)))


def _events(job: Job, action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(subject=f"job:{job.pk}", action=action))


def test_a_job_is_pending_until_the_new_layout_is_measured_then_met(measured, seed):
    job, prediction = _ended()
    assert prediction.noise_floor == 0.141 and prediction.predicted_speedup == pytest.approx(PREDICTED, abs=1e-5)
    job.refresh_from_db()
    assert (job.status, job.speed_verdict, job.outcome) == ("succeeded", "pending",
                                                            "succeeded, awaiting a speed measurement")
    seed([9, 4, 3], [19.8, 10.0, 9.0])  # x0.808: 9.1% slower than predicted, inside the floor
    job.refresh_from_db()
    assert (job.status, job.speed_verdict, job.outcome) == ("succeeded", "met", "succeeded, met prediction")
    (event,) = _events(job, "job.prediction_met")
    assert event.payload["speedup"]["missed"] is False


def test_a_miss_beyond_the_floor_is_succeeded_missed_prediction_audited_and_announced(
        measured, seed, settings, monkeypatch, django_capture_on_commit_callbacks):
    settings.SEAM_WEBHOOK_URLS, settings.SEAM_WEBHOOK_KEY = ["http://127.0.0.1:9/hook"], "verdict-key"
    sent = []
    monkeypatch.setattr(webhooks.deliver, "apply_async", lambda args: sent.append(args))
    job, _prediction = _ended()
    with django_capture_on_commit_callbacks(execute=True):
        seed([9, 4, 3], [30.0, 10.0, 9.0])  # x0.533: 40% slower than predicted
    job.refresh_from_db()
    assert (job.status, job.speed_verdict, job.outcome) == ("succeeded", "missed", "succeeded, missed prediction")
    (event,) = _events(job, "job.prediction_missed")
    speedup = event.payload["speedup"]
    assert speedup["predicted"] == pytest.approx(PREDICTED, abs=1e-5)
    assert speedup["measured"] == pytest.approx(16.0 / 30.0, abs=1e-5) and speedup["noise_floor"] == 0.141
    assert speedup["error"] == pytest.approx((16.0 / 30.0) / PREDICTED - 1, abs=1e-4) and speedup["missed"]
    assert (event.before, event.after) == ({"speed_verdict": "pending"}, {"speed_verdict": "missed"})
    (_url, body, signature, _delivery, event_name) = sent[-1]
    assert event_name == "job.missed_prediction" and webhooks.signature_matches(body.encode(), signature,
                                                                                "verdict-key")
    announced = json.loads(body)
    assert announced["event"] == "job.missed_prediction" and announced["job"]["id"] == job.pk
    assert announced["job"]["outcome"] == "succeeded, missed prediction" and announced["speedup"]["missed"]


def test_the_floor_the_prediction_was_made_with_judges_it(seed):
    """Pins that the verdict uses the floor stored with the prediction (the fit's, measured from repeats), not the
    rig's: 8,4,4 measured six times within 2% gives a floor of about 1.7%, and a 9.1% error then misses, where the
    rig's 14.1% would have called it met."""
    for cut in ([7, 5, 4], [8, 5, 3]):
        seed(cut, stages(cut))
    for wobble in (0.0, 0.1, -0.1, 0.05, -0.05, 0.0):
        seed([8, 4, 4], [ms + wobble for ms in stages([8, 4, 4])])
    job, prediction = _ended()
    assert 0 < prediction.noise_floor < 0.05
    seed([9, 4, 3], [19.8, 10.0, 9.0])
    job.refresh_from_db()
    assert job.speed_verdict == "missed"


def test_without_a_predicted_speedup_there_is_no_verdict_to_wait_for():
    job, prediction = _ended(before=(7, 5, 4), after=(8, 4, 4))  # the layout before was never measured
    assert prediction.predicted_speedup is None
    job.refresh_from_db()
    assert job.speed_verdict == "unmeasured" and job.outcome == "succeeded, speed not judged"


def test_a_judged_verdict_is_final(measured, seed):
    """Pins the compare-and-set: only a job still unjudged (blank or pending) is judged."""
    job, _prediction = _ended()
    seed([9, 4, 3], [30.0, 10.0, 9.0])
    assert verdicts.judge_speed(job, predicted=PREDICTED, measured=PREDICTED, noise_floor=0.141,
                                awaiting=False) == "missed"
    job.refresh_from_db()
    assert job.speed_verdict == "missed" and len(_events(job, "job.prediction_missed")) == 1
    assert not _events(job, "job.prediction_met")


def test_a_job_that_did_not_succeed_gets_no_verdict(measured, seed):
    """Pins the status filter: the verdict is a succeeded job's; a rolled back one keeps none."""
    job = executed_job([8, 4, 4], [9, 4, 3])
    Job.objects.filter(pk=job.pk).update(status="rolled_back")
    assert verdicts.judge_speed(job, predicted=PREDICTED, measured=0.5, noise_floor=0.141, awaiting=False) == ""
    job.refresh_from_db()
    assert job.speed_verdict == "" and job.outcome == "rolled_back"
    assert not _events(job, "job.prediction_missed")
