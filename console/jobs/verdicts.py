"""Jobs judged on speed as well as memory: a succeeded job's measured speedup against its predicted one.

The calibration (console.calibration.predictions) calls `judge_speed` when it makes a job's prediction (the job's
operation has just ended) and again when the first measurement of the new layout with decode steps completes it.
The verdict (choices.SpeedVerdict) is `pending` while that measurement is awaited, then `met` or `missed` by
solvers.verdict.check_speed (|measured / predicted - 1| beyond the noise floor the prediction was made with), or
`unmeasured` when there is nothing to judge (no speedup predicted, no floor, or no measurement of the layout before
to measure the speedup from). Only a succeeded job gets one, and its status stays `succeeded`.

A judged verdict is final and audited (`job.prediction_met` / `job.prediction_missed`, with the predicted and
measured speedups, the floor and the error); a miss also sends the `job.missed_prediction` webhook, on commit, and
the job page then offers a revert (lifecycle.propose_revert). Every write is compare-and-set on the verdict, so a
measurement recorded twice judges once.
"""

from __future__ import annotations

from functools import partial

from django.db import transaction
from django.utils import timezone

from console.audit.services import record
from console.jobs import webhooks
from console.jobs.choices import UNJUDGED, JobStatus, SpeedVerdict
from console.jobs.lifecycle import job_id_of, publish_on_commit, subject_of
from console.jobs.models import Job
from solvers.verdict import SpeedCheck, check_speed

__all__ = ["judge_speed", "speed_check"]


def speed_check(predicted: float | None, measured: float | None, noise_floor: float | None) -> SpeedCheck | None:
    """The check of a prediction's speedup, or None while any of the three figures is missing."""
    if predicted is None or measured is None or noise_floor is None:
        return None
    return check_speed(predicted, measured, noise_floor)


def judge_speed(job: Job | int, *, predicted: float | None, measured: float | None, noise_floor: float | None,
                awaiting: bool) -> str:
    """Record the job's speed verdict from its prediction's figures (`awaiting`: its measurement is still to come);
    returns the verdict the job then holds."""
    job_id = job_id_of(job)
    check = speed_check(predicted, measured, noise_floor)
    if check is not None:
        verdict = SpeedVerdict.MISSED if check.missed else SpeedVerdict.MET
    else:
        verdict = SpeedVerdict.PENDING if awaiting and predicted is not None else SpeedVerdict.UNMEASURED
    with transaction.atomic():
        before = Job.objects.filter(pk=job_id).values_list("speed_verdict", flat=True).first()
        if before not in UNJUDGED or before == verdict:
            return before or ""
        changed = Job.objects.filter(pk=job_id, status=JobStatus.SUCCEEDED, speed_verdict=before).update(
            speed_verdict=verdict, updated=timezone.now())
        job = Job.objects.get(pk=job_id)
        if not changed:  # not succeeded, or judged meanwhile
            return job.speed_verdict
        if check is not None:
            action = "job.prediction_missed" if check.missed else "job.prediction_met"
            record(actor=None, action=action, subject=subject_of(job), payload={"speedup": check.to_dict()},
                   before={"speed_verdict": before}, after={"speed_verdict": verdict})
        if verdict == SpeedVerdict.MISSED:
            transaction.on_commit(partial(webhooks.announce_missed_prediction, job, check), robust=True)
        publish_on_commit(job)
    return verdict
