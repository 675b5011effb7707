"""A layout change no job of the console caused — someone holding the engine's secrets, or an operator going around
the console — is audited once and shown on the dashboard; a job's own change is not (issue 13, item 1)."""

from __future__ import annotations

import re

import pytest

from console.audit.models import AuditEvent
from console.calibration import recording
from console.calibration.models import JobPrediction
from console.jobs import layout_watch, lifecycle, worker
from console.jobs.layout_watch import UNEXPLAINED_CHANGE
from contracts.control import EngineState
from tests.support.jobs import move_engine, other_cut

pytestmark = pytest.mark.django_db(transaction=True)


def _warning(client) -> str | None:
    page = client.get("/").content.decode()
    found = re.search(r'data-testid="unexplained-layout-change">(.*?)</p>', page, re.S)
    return " ".join(found.group(1).split()) if found else None


@pytest.fixture
def run_job(live_engine, operator, reviewer, handoffs):
    """run_job() -> a cut change proposed, approved and run by the worker code, ended succeeded."""
    def run():
        job = lifecycle.approve(reviewer, lifecycle.propose(operator, {"kind": "cut",
                                                                       "target": {"cut": other_cut(live_engine)}}))
        assert worker.execute(job.pk) == "succeeded"
        return job
    return run


def test_a_change_no_job_caused_is_audited_once_and_shown_on_the_dashboard(live_engine, viewer, client):
    before = live_engine.state()
    assert layout_watch.watch() == f"first seen: layout {before['fingerprint']}"
    moved = move_engine(live_engine)  # applied with a self-made attestation: the console ran no job for it
    after = live_engine.state()

    assert layout_watch.watch() == f"unexplained: layout {before['fingerprint']} -> {moved}"
    assert layout_watch.watch() == f"unchanged: layout {moved}"  # recorded once per change
    [event] = AuditEvent.objects.filter(action=UNEXPLAINED_CHANGE)
    assert event.actor is None and event.actor_name == "system"
    assert event.before == {"fingerprint": before["fingerprint"], "cut": before["cut"], "shape": before["shape"]}
    assert event.after == {"fingerprint": moved, "cut": after["cut"], "shape": after["shape"]}

    client.force_login(viewer)
    warning = _warning(client)
    assert warning is not None and "no job caused it" in warning
    assert f"layout {before['fingerprint']}" in warning and f"layout {moved}" in warning
    assert f'href="/audit/?action={UNEXPLAINED_CHANGE}"' in warning
    assert UNEXPLAINED_CHANGE in client.get(f"/audit/?action={UNEXPLAINED_CHANGE}").content.decode()


def test_a_job_end_reads_the_engines_state_once_for_the_watch_and_the_calibration(live_engine, run_job,
                                                                                    monkeypatch):
    noted: dict[str, EngineState] = {}
    for module in (layout_watch, recording):
        def note(job, state, engine_url, real=module.note_job_end, name=module.__name__):
            noted[name] = state
            real(job, state, engine_url)
        monkeypatch.setattr(module, "note_job_end", note)
    job = run_job()
    assert noted[layout_watch.__name__] is noted[recording.__name__]  # one read, handed to both
    assert noted[layout_watch.__name__].fingerprint == live_engine.state()["fingerprint"]
    assert job.layout_observations.count() == 1 and JobPrediction.objects.filter(job=job).exists()


def test_a_change_a_job_caused_is_not_flagged(live_engine, run_job, viewer, client):
    layout_watch.watch()
    job = run_job()
    assert layout_watch.watch() == f"unchanged: layout {live_engine.state()['fingerprint']}"
    assert not AuditEvent.objects.filter(action=UNEXPLAINED_CHANGE).exists()
    assert job.layout_observations.count() == 1
    client.force_login(viewer)
    assert _warning(client) is None


def test_a_job_whose_worker_could_not_note_the_layout_still_explains_it_but_nothing_later(live_engine, run_job,
                                                                                          monkeypatch):
    layout_watch.watch()
    with monkeypatch.context() as lost:  # the engine could not be read right after the job ended
        lost.setattr(layout_watch, "note_job_end", lambda job, state, engine_url: None)
        job = run_job()
    assert layout_watch.watch() == f"layout {live_engine.state()['fingerprint']}: job {job.pk}'s doing"
    moved = move_engine(live_engine)  # that job ended before: it explains nothing after
    assert layout_watch.watch().endswith(f"-> {moved}")
    assert AuditEvent.objects.filter(action=UNEXPLAINED_CHANGE).count() == 1


def test_while_a_job_runs_nothing_is_decided(live_engine, operator, reviewer, handoffs):
    layout_watch.watch()
    job = lifecycle.approve(reviewer, lifecycle.propose(operator, {"kind": "cut",
                                                                   "target": {"cut": other_cut(live_engine)}}))
    lifecycle.start(job.pk, worker="w1")
    move_engine(live_engine)
    assert layout_watch.watch() == f"job {job.pk} is running: its end explains the change"
    assert not AuditEvent.objects.filter(action=UNEXPLAINED_CHANGE).exists()
