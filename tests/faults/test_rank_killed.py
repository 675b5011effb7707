"""SIGKILL one engine rank process while the engine runs a job's cut change: the engine reports the failure,
replaces its ranks, restores the verified layout, and the job ends rolled_back with the reason; requests in
flight during it all complete (or are refused, saying why): none vanish."""

from __future__ import annotations

import random

import pytest

from console.audit.models import AuditEvent
from console.jobs import lifecycle
from console.jobs.models import Job
from tests.support.faults import Requests, operation_phase, rank_held, rank_pids, sigkill, wait_until, waiting_requests
from tests.support.jobs import other_cut, wait_for_end
from tests.support.live_service import LiveService

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MAX_TOKENS = 8


@pytest.fixture
def own_engine(demo_checkpoint, settings):
    """An engine of this test's own: its ranks are killed and replaced."""
    engine = LiveService(demo_checkpoint)
    settings.ENGINE_URL = engine.url
    yield engine
    engine.stop()


def test_a_rank_killed_mid_operation_rolls_back_and_loses_no_request(own_engine, workers, operator, reviewer):
    rng = random.Random(6)
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randrange(4, 60))] for _ in range(6)]
    expected = [own_engine.complete(prompt, MAX_TOKENS) for prompt in prompts]  # the same engine, undisturbed
    before, pids = own_engine.state(), rank_pids(own_engine)
    workers.start(SEAM_ENGINE_URL=own_engine.url)
    job = lifecycle.propose(operator, {"kind": "cut", "target": {"cut": other_cut(own_engine)}})

    with rank_held(pids[2]):
        lifecycle.approve(reviewer, job)
        operation_id = wait_until(lambda: Job.objects.get(pk=job.pk).engine_operation_id, what="the apply")
        wait_until(lambda: operation_phase(own_engine, operation_id) == "acting", what="the operation to act")
        in_flight = Requests(own_engine.url, prompts, MAX_TOKENS)  # arrive while the operation runs
        wait_until(lambda: waiting_requests(own_engine) == len(prompts), what="the requests to be queued")
        sigkill(pids[2])

    done = wait_for_end(job.pk, timeout=120)
    assert done.status == "rolled_back", (done.status, done.error)
    assert "rank 2: the rank process died (exit code -9)" in done.error  # the engine names the rank and the kill
    assert done.operation["previous"]["pool_tokens"] == before["pool_tokens"]  # restored and measured again
    event = AuditEvent.objects.get(subject=f"job:{job.pk}", action="job.rolled_back")
    assert event.payload["error"] == done.error and event.payload["previous_pool_tokens"] == before["pool_tokens"]

    results = in_flight.join()
    outcomes = [(status, body["choices"][0]["token_ids"] if status == 200 else body) for status, body in results]
    assert all(status == 200 for status, _ in outcomes), outcomes  # none vanished; here, none was even refused
    assert [tokens for _, tokens in outcomes] == expected

    after = own_engine.state()
    assert (after["phase"], after["cut"], after["fingerprint"]) == ("serving", before["cut"], before["fingerprint"])
    replaced = rank_pids(own_engine)
    assert pids[2] not in replaced and len(set(replaced)) == 3  # every rank process was replaced
