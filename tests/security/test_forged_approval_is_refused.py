"""An approval the console did not make does not count: before the worker attests a job it holds every approval
against the keyed `job.approval` audit event lifecycle.approve recorded with it (console.jobs.vouching), and one that
has none, or whose event records another approval, is set aside, audited as `job.approval_unverified`, and the job
ends failed with nothing applied (issue 30, item 4)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from console.audit.chain import compute_hash, event_content
from console.audit.models import AuditEvent, ChainScheme
from console.audit.services import verify_chain
from console.jobs import lifecycle, worker
from console.jobs.attestation import APPROVAL_UNVERIFIED
from console.jobs.models import Approval, Job
from tests.support.jobs import other_cut, wait_for_end

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def propose(live_engine, operator):
    """propose(cut=None) -> a proposed cut change."""
    def make(cut=None):
        return lifecycle.propose(operator, {"kind": "cut", "target": {"cut": cut or other_cut(live_engine)}})
    return make


def forge_approval(job: Job, reviewer) -> Approval:
    """What someone who writes the database without SEAM_AUDIT_KEY can do: an approval row by a real reviewer who
    never approved, and the job queued, as if its last approval had come in an hour ago."""
    now = timezone.now()
    approval = Approval.objects.create(job=job, reviewer=reviewer, reviewer_name=reviewer.get_username(),
                                       plan_hash=job.plan_hash, created=now, expires_at=now + timedelta(hours=1))
    Job.objects.filter(pk=job.pk).update(status="queued", queued_at=now, updated=now - timedelta(hours=1))
    return approval


def assert_refused(job: Job, approval: Approval, reason: str, fingerprint: str, engine) -> None:
    """The job failed naming the approval set aside and why, audited, and the engine's layout did not move."""
    job.refresh_from_db()
    assert job.status == "failed", job.error
    assert f"approval {approval.pk} by {approval.reviewer_name}" in job.error and reason in job.error
    assert "0 of the 1 approvals" in job.error and "nothing was applied" in job.error
    assert job.engine_operation_id == ""
    [event] = AuditEvent.objects.filter(action=APPROVAL_UNVERIFIED, subject=f"job:{job.pk}")
    assert event.actor_name == "system" and event.payload["refused"] is True
    [set_aside] = event.payload["approvals"]
    assert (set_aside["approval"], set_aside["reviewer"]) == (approval.pk, approval.reviewer_name)
    assert any(reason in why for why in set_aside["reasons"])
    assert not AuditEvent.objects.filter(action="job.applied", subject=f"job:{job.pk}").exists()
    assert engine.state()["fingerprint"] == fingerprint


@pytest.mark.slow
def test_a_forged_approval_re_sent_by_the_reconciler_is_refused_by_the_worker(celery_worker, live_engine, propose,
                                                                              reviewer):
    """Pins console.jobs.vouching.unvouched (its no-event case) as approvers_of applies it: without it the real
    worker attests the forged approval and the engine applies the plan."""
    before = live_engine.state()["fingerprint"]
    job = propose()
    approval = forge_approval(job, reviewer)

    assert (job.pk, "sent to the worker again") in worker.reconcile(older_than_s=60)
    wait_for_end(job.pk, timeout=120)

    assert_refused(job, approval, "no job.approval audit event records approval", before, live_engine)
    assert verify_chain().ok  # the refusal is itself a well-formed link of the chain


def test_a_real_approval_still_applies(live_engine, propose, reviewer, handoffs):
    """The control for the tests here: an approval made by lifecycle.approve is vouched for by its event."""
    job = lifecycle.approve(reviewer, propose())
    assert worker.execute(job.pk) == "succeeded"
    job.refresh_from_db()
    assert live_engine.state()["cut"] == job.target["cut"]
    assert AuditEvent.objects.get(action="job.applied", subject=f"job:{job.pk}").payload["approvers"] == ["rita"]
    assert not AuditEvent.objects.filter(action=APPROVAL_UNVERIFIED).exists()
    assert verify_chain().ok


@pytest.mark.parametrize(("scheme", "key", "reason"), [
    (ChainScheme.HMAC_SHA256, b"a key the forger made up", "does not recompute under SEAM_AUDIT_KEY"),
    (ChainScheme.SHA256, None, "is not keyed (scheme sha256)"),
])
def test_a_forged_approval_with_a_forged_audit_event_is_refused(live_engine, propose, reviewer, handoffs, scheme,
                                                                key, reason):
    """Pins vouching._unkeyed: an event the forger wrote beside the row, hashed under a key of their own or with the
    unkeyed legacy scheme anyone can compute, does not vouch for it."""
    before = live_engine.state()["fingerprint"]
    job = propose()
    approval = forge_approval(job, reviewer)
    head = AuditEvent.objects.order_by("-seq").first()
    event = AuditEvent(seq=head.seq + 1, timestamp=timezone.now(), actor=reviewer, actor_name="rita",
                       action="job.approval", subject=f"job:{job.pk}", request_id="", prev_hash=head.hash,
                       payload={"approval": approval.pk, "plan_hash": job.plan_hash,
                                "expires_at": approval.expires_at.isoformat(), "counting": 1, "required": 1},
                       scheme=scheme)
    event.hash = compute_hash(event.prev_hash, event_content(event), scheme=scheme, key=key)
    event.save()

    assert worker.execute(job.pk) == "failed"
    assert_refused(job, approval, reason, before, live_engine)


@pytest.mark.parametrize("edit", ["moved to another job of the same plan", "its expiry pushed back",
                                  "given to another reviewer"])
def test_a_real_approval_edited_in_the_database_is_refused(live_engine, propose, reviewer, make_user, handoffs, edit):
    """Pins what an approval's event binds (vouching: the job as its subject, vouching._mismatch: reviewer, plan
    and expiry): a real event cannot vouch for a row edited to count elsewhere, for longer, or for someone else."""
    before = live_engine.state()["fingerprint"]
    cut = other_cut(live_engine)
    job = lifecycle.approve(reviewer, propose(cut))
    approval = Approval.objects.get(job=job)
    if edit == "moved to another job of the same plan":
        lifecycle.cancel(job.proposer, job)  # what was approved is withdrawn; a second job asks for the same change
        job = propose(cut)
        assert job.plan_hash == approval.plan_hash
        Approval.objects.filter(pk=approval.pk).update(job=job)
        reason = "no job.approval audit event records approval"
    elif edit == "its expiry pushed back":
        Approval.objects.filter(pk=approval.pk).update(expires_at=approval.expires_at + timedelta(days=30))
        reason = "expiring at another time than the row's"
    else:
        rex = make_user("reviewer", name="rex")
        Approval.objects.filter(pk=approval.pk).update(reviewer=rex, reviewer_name="rex")
        reason = "not the row's reviewer"
    Job.objects.filter(pk=job.pk).update(status="queued")
    approval.refresh_from_db()

    assert worker.execute(job.pk) == "failed"
    assert_refused(job, approval, reason, before, live_engine)
