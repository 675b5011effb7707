"""Jobs judged on speed, through the API, against the real engine (the session's, three CPU ranks): the job's
`speed_verdict`, `outcome` and `speedup` fields, and POST /api/v1/jobs/{id}/revert/ with its refusals.

How a job misses here, for real: the jobs run on the engine (propose -> approve -> execute in this process, as
tests/console/calibration/test_live_calibration.py does), completions are sent at each layout and what the engine
measured is recorded as beat records it, so the measured speedup is the engine's own. The prediction is made with a
calibration the operator could have had and should not have trusted: besides the real measurement of the layout
before, six runs of two other cuts (`wrong_calibration`, copies of the engine's real measurement with other stage
times) that claim the last rank costs 50 ms a layer and the others 1 ms, run to run within 0.1%. Fitted over them the
prediction follows the last rank's layers, while on the CPU ranks the first rank (embeddings, head, sampling) sets the
pace: the real speedup follows the first rank's layers, and the floor it is judged by (measured from those repeats)
is about 0.1%, so it misses. (A claim on the first rank would predict the first rank's layer ratio, which a loaded
machine can really deliver within 0.1%.)
"""

from __future__ import annotations

import pytest

from console.audit.models import AuditEvent
from console.calibration import recording
from console.jobs import lifecycle, worker
from console.jobs.models import Job
from contracts.control import EngineState
from tests.support.jobs import move_engine, other_cut

# Committed rows (emptied after each test): job ids keep rising, and the session engine refuses one it has seen.
pytestmark = pytest.mark.django_db(transaction=True)

JOBS = "/api/v1/jobs/"
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16, 17, 18]]
CLAIMED_MS_PER_LAYER = (1.0, 1.0, 50.0)


def serve_and_measure(engine) -> None:
    """Send completions, then record what the engine measured of its layout, as beat does."""
    for prompt in PROMPTS:
        engine.complete(prompt, 12)
    said = recording.measure()
    assert said.startswith("measured layout"), said


def wrong_calibration(engine, avoid: list[list[int]]) -> None:
    """Six runs each of two cuts other than `avoid`, recorded as measurements of this engine's model and rig."""
    state = engine.state()
    real = state["measurement"]
    candidates = [cut for cut in ([6, 5, 5], [5, 6, 5], [6, 6, 4], [7, 4, 5], [5, 5, 6]) if cut not in avoid]
    # Two arms with different last-rank layers, so the fit identifies the cost it is told.
    arms = [candidates[0], next(cut for cut in candidates if cut[-1] != candidates[0][-1])]
    for cut in arms:
        for run in range(6):
            ms = [layers * per * (1 + 0.0005 * (run % 3 - 1)) for layers, per in zip(cut, CLAIMED_MS_PER_LAYER,
                                                                                        strict=True)]
            decode = {"steps": 40, "median_tokens": 1.0, "median_ms": ms, "spread_ms": [0.01] * 3}
            measured = {**real, "cut": cut, "fingerprint": "calibration-" + "-".join(map(str, cut)), "decode": decode}
            assert recording.record(EngineState.from_dict({**state, "measurement": measured}), "periodic",
                                    engine_url=engine.url)


def run_job(operator, reviewer, cut: list[int]) -> Job:
    job = lifecycle.propose(operator, {"kind": "cut", "target": {"cut": cut}})
    lifecycle.approve(reviewer, job)
    assert worker.execute(job.pk, worker="w-verdict") == "succeeded", Job.objects.get(pk=job.pk).error
    return Job.objects.get(pk=job.pk)


@pytest.fixture
def missed(live_engine, operator, reviewer, handoffs, settings) -> Job:
    """A job that ran on the engine and missed its predicted speedup; the engine still runs its layout."""
    settings.SEAM_MEASURE_S = 0  # beat's bound between periodic rows; the test measures when it has served
    before = live_engine.state()["cut"]
    after = other_cut(live_engine)
    serve_and_measure(live_engine)
    wrong_calibration(live_engine, [before, after])
    job = run_job(operator, reviewer, after)
    serve_and_measure(live_engine)
    job.refresh_from_db()
    assert job.speed_verdict == "missed", (job.speed_verdict, job.layout_prediction.notes)
    return job


def test_a_missed_job_reads_succeeded_missed_prediction_with_its_speedup(missed, viewer, get):
    body = get(f"{JOBS}{missed.pk}/", user=viewer)
    assert (body["status"], body["speed_verdict"], body["outcome"]) == ("succeeded", "missed",
                                                                        "succeeded, missed prediction")
    speedup, prediction = body["speedup"], missed.layout_prediction
    assert speedup["predicted"] == prediction.predicted_speedup and speedup["measured"] == prediction.measured_speedup
    assert speedup["noise_floor"] == prediction.noise_floor < 0.01 and speedup["missed"]
    assert abs(speedup["error"]) > speedup["noise_floor"]
    assert body["incumbent_layout"]["cut"] == prediction.before_cut and body["reverts"] is None
    listed = {row["id"]: row for row in get(JOBS, user=viewer)["results"]}
    assert listed[missed.pk]["outcome"] == "succeeded, missed prediction"
    event = AuditEvent.objects.get(subject=f"job:{missed.pk}", action="job.prediction_missed")
    assert event.payload["speedup"] == {**speedup, "error": round(speedup["error"], 6)}


def test_revert_proposes_the_layout_before_for_review_linked_to_the_missed_job(
        missed, live_engine, operator, reviewer, post, get, handoffs):
    before = missed.incumbent_layout
    body = post(f"{JOBS}{missed.pk}/revert/", user=operator, expect=201, HTTP_X_REQUEST_ID="revert-req-1")
    assert body["status"] == "proposed" and body["kind"] == "cut" and body["reverts"] == missed.pk
    assert body["target"] == {"cut": before["cut"]} and body["outcome"] == "proposed"
    revert = Job.objects.get(pk=body["id"])
    assert revert.incumbent_fingerprint == live_engine.state()["fingerprint"] != before["fingerprint"]
    assert get(f"{JOBS}{missed.pk}/", user=operator)["reverted_by"] == [revert.pk]
    proposed = AuditEvent.objects.get(subject=f"job:{revert.pk}", action="job.proposed")
    assert proposed.payload["reverts"] == missed.pk and proposed.request_id == "revert-req-1"
    linked = AuditEvent.objects.get(subject=f"job:{missed.pk}", action="job.revert_proposed")
    assert linked.payload["revert"] == revert.pk and linked.actor_name == operator.get_username()
    # The same review gate as any other job: the proposer cannot approve it, another reviewer can.
    post(f"{JOBS}{revert.pk}/approve/", {"plan_hash": revert.plan_hash}, user=operator, expect=403)
    post(f"{JOBS}{revert.pk}/approve/", {"plan_hash": revert.plan_hash}, user=reviewer)
    assert worker.execute(revert.pk) == "succeeded"
    assert live_engine.state()["fingerprint"] == before["fingerprint"]


def test_a_second_revert_while_the_first_is_pending_is_refused(missed, operator, post):
    """Pins the refusal of a second revert while one is still active."""
    first = post(f"{JOBS}{missed.pk}/revert/", user=operator, expect=201)
    answer = post(f"{JOBS}{missed.pk}/revert/", user=operator, expect=409)
    assert f"job {first['id']} already proposes to revert job {missed.pk}" in answer["detail"]
    assert Job.objects.filter(reverts=missed).count() == 1


def test_revert_is_refused_once_the_engine_has_moved_on(missed, live_engine, operator, post):
    """Pins the stale check: the revert is planned against the layout the job left, so once the engine runs another
    one (someone changed it since) there is nothing of the job's to revert."""
    moved = move_engine(live_engine)
    answer = post(f"{JOBS}{missed.pk}/revert/", user=operator, expect=409)
    assert "no longer the engine's" in answer["detail"] and moved in answer["detail"]
    assert not Job.objects.filter(reverts=missed).exists()
    refused = AuditEvent.objects.get(subject=f"job:{missed.pk}", action="job.revert_refused")
    assert refused.payload["code"] == "Conflict"


def test_revert_of_a_job_that_met_or_did_not_succeed_is_refused(missed, proposed, operator, post):
    """Pins the verdict check: only a succeeded job that missed its prediction is reverted."""
    Job.objects.filter(pk=missed.pk).update(speed_verdict="met")
    answer = post(f"{JOBS}{missed.pk}/revert/", user=operator, expect=409)
    assert "is succeeded, met prediction" in answer["detail"]
    job = proposed()
    answer = post(f"{JOBS}{job['id']}/revert/", user=operator, expect=409)
    assert f"job {job['id']} is proposed" in answer["detail"]
    assert not Job.objects.exclude(reverts=None).exists()


def test_only_an_operator_may_propose_a_revert(missed, viewer, reviewer, post):
    for user in (viewer, reviewer):
        assert "operator" in post(f"{JOBS}{missed.pk}/revert/", user=user, expect=403)["detail"]
    assert not Job.objects.exclude(reverts=None).exists()


def test_revert_of_no_job_is_404(operator, post):
    assert "no job 999" in post(f"{JOBS}999/revert/", user=operator, expect=404)["detail"]
