"""The engine is down when a job runs: the job fails naming the engine's URL, and nothing retries it into a
half-applied state — the engine that comes back at that address has seen no apply."""

from __future__ import annotations

import time

import pytest

from console.jobs import lifecycle, worker
from console.jobs.tasks import run_job
from tests.support import live_service
from tests.support.faults import operations_total, wait_until
from tests.support.jobs import actions, other_cut, wait_for_end

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_job_run_while_the_engine_is_down_fails_naming_it_and_is_not_retried(demo_checkpoint, workers, settings,
                                                                                operator, reviewer, monkeypatch):
    engine = live_service.LiveService(demo_checkpoint)  # of its own: stopped and started again below
    settings.ENGINE_URL = engine.url
    first_layout = engine.state()["fingerprint"]
    job = lifecycle.propose(operator, {"kind": "cut", "target": {"cut": other_cut(engine)}})
    engine.stop()  # the engine goes away after the proposal

    pool = workers.start(SEAM_ENGINE_URL=engine.url)
    lifecycle.approve(reviewer, job)
    done = wait_for_end(job.pk)
    assert done.status == "failed" and done.engine_operation_id == ""
    assert f"engine unreachable at {engine.url}" in done.error and "nothing was applied" in done.error

    # The engine comes back at the same address; a redelivery and the reconciler must not touch it.
    monkeypatch.setattr(live_service, "free_port", lambda: engine.port)
    back = live_service.LiveService(demo_checkpoint)
    try:
        assert back.url == engine.url
        run_job.delay(job.pk)
        wait_until(lambda: any(f"job {job.pk} not started" in line for line in pool.output), what="the redelivery")
        assert worker.reconcile(older_than_s=0) == []
        time.sleep(0.5)
        assert operations_total(back) == 0 and back.state()["fingerprint"] == first_layout
        assert actions(job)[-2:] == ["job.running", "job.failed"] and "job.applied" not in actions(job)
        assert wait_for_end(job.pk).status == "failed"
    finally:
        back.stop()
