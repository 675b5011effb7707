"""The audit trail's attacker table (docs/console.md, "Trust model"; issue 30, item 3): one test per row, each showing
what that attacker can do and what catches it.

Rows: the database writer alone; the anchor-file writer alone; both (an older copy restored, the anchor cut to
match); the holder of SEAM_AUDIT_KEY (with both); the holder of SEAM_APPROVAL_KEY; the holder of the control token;
webhook receivers as witnesses. The engine's state-dir writer: tests/security/test_engine_audit_witness.py.

Events are recorded through the service and committed for real (transaction=True), so each is anchored as in
production; the attackers work below the ORM with raw SQL and plain file writes.
"""

from __future__ import annotations

import json
import time

import pytest
from django.core.management import call_command
from django.db import connection

from console.audit.anchor import anchor_mac, anchor_path
from console.audit.chain import compute_hash, event_content
from console.audit.models import AuditEvent
from console.audit.services import audit_head, record, verify_chain
from console.audit.witness import engine_witness
from console.engine import EngineClient, EngineRefused
from console.jobs import lifecycle, webhooks, worker
from console.jobs.models import Job
from contracts.attestation import AuditHead, sign_attestation
from contracts.canonical import canonical_json
from contracts.control import WitnessedHead
from tests.support.jobs import apply_as_the_worker, other_cut

pytestmark = pytest.mark.django_db(transaction=True)
TRIGGER = "audit_auditevent_append_only"


def fill(count: int) -> None:
    """`count` more committed (so anchored) events."""
    for n in range(count):
        record(actor=None, action="test.filler", subject=f"filler:{n}", payload={"n": n})


def _sql(sql: str, params=()) -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":  # the append-only trigger, switched off as the table's owner could
            cursor.execute(f"ALTER TABLE audit_auditevent DISABLE TRIGGER {TRIGGER}")
        cursor.execute(sql, params)
        if connection.vendor == "postgresql":
            cursor.execute(f"ALTER TABLE audit_auditevent ENABLE TRIGGER {TRIGGER}")


def restore_older_copy(seq: int) -> None:
    """The database writer's rollback: the trail as an older copy of the database has it, ending at `seq`."""
    _sql("DELETE FROM audit_auditevent WHERE seq > %s", [seq])


def anchor_lines() -> list[dict]:
    return [json.loads(line) for line in anchor_path().read_text().splitlines()]


def cut_anchor_to(seq: int) -> None:
    """The anchor-file writer's half: the file as it was when event `seq` was the newest."""
    kept = [line for line in anchor_path().read_text().splitlines() if json.loads(line)["seq"] <= seq]
    anchor_path().write_text("".join(line + "\n" for line in kept))


@pytest.fixture
def run_job(live_engine, operator, reviewer, handoffs):
    """run_job() -> a cut change proposed, approved and run by the worker code (attested, so the engine witnessed the
    trail's head when it was signed), ended succeeded."""
    def run():
        job = approved_job(live_engine, operator, reviewer)
        assert worker.execute(job.pk) == "succeeded"
        return job
    return run


def approved_job(live_engine, operator, reviewer):
    return lifecycle.approve(reviewer, lifecycle.propose(operator, {"kind": "cut",
                                                                    "target": {"cut": other_cut(live_engine)}}))


def witnessed() -> WitnessedHead:
    with EngineClient() as engine:
        head = engine.audit_head(audit_head().trail)
    assert head is not None
    return head


# --- the database writer alone ----------------------------------------------------------------------------------

def test_database_writer_alone_restoring_an_older_copy_is_caught_by_the_anchor():
    fill(8)
    restore_older_copy(3)
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken) == (False, 3, 4)
    assert "the anchor file names event #8 but the chain ends at #3" in result.reason


# --- the anchor-file writer alone -------------------------------------------------------------------------------

def test_anchor_writer_alone_deleting_the_file_is_caught_even_once_the_next_event_recreates_it():
    """Pins verification._unsound_anchor's 'begins late' rule: before it, the recreated file verified ok."""
    fill(4)
    anchor_path().unlink()
    missing = verify_chain()
    assert not missing.ok and "the chain holds keyed events but there is no anchor file" in missing.reason
    fill(1)  # the next append recreates the file, naming only event #5
    result = verify_chain()
    assert (result.ok, result.anchored_seq) == (False, 5)
    assert result.reason.startswith("the anchor file begins at event #5, after the first keyed event #1, and no line "
                                    "under SEAM_AUDIT_KEY says it was rotated or re-anchored")


def test_anchor_writer_alone_cutting_lines_hides_nothing():
    """Cutting the file's newest lines only makes it vouch for less: the database still holds every event."""
    fill(6)
    cut_anchor_to(2)
    result = verify_chain()
    assert (result.ok, result.checked, result.anchored_seq) == (True, 6, 2)


def test_an_operator_re_anchors_knowingly_and_the_step_is_audited():
    """The way back from a deleted anchor file: manage.py reanchor_audit records why and opens a keyed file."""
    fill(4)
    anchor_path().unlink()
    fill(1)
    assert not verify_chain().ok
    call_command("reanchor_audit", "--reason", "disk replaced; trail checked against last night's export")
    event = AuditEvent.objects.order_by("-seq").first()
    assert (event.action, event.payload["reason"]) == ("audit.reanchor",
                                                       "disk replaced; trail checked against last night's export")
    assert event.payload["verify_before"].startswith("broken after 5 good events: the anchor file begins at event #5")
    assert [line.get("opened") for line in anchor_lines()] == ["reanchor", None]
    assert verify_chain().ok


# --- both: an older copy restored, the anchor file cut to match --------------------------------------------------

@pytest.mark.slow
def test_database_and_anchor_writers_together_are_caught_by_the_engine(run_job, live_engine, operator, reviewer):
    """Pins engine/control/audit_witness.py (the restored console's attestation is refused) and
    verification._rolled_back
    (verify fails against the witnessed head): without either, the rollback passed."""
    fill(30)
    run_job()
    head = witnessed()
    assert head.seq > 30 and head.rolled_back is None
    assert verify_chain(engine_witness).ok

    restore_older_copy(5)
    cut_anchor_to(5)
    assert verify_chain().ok  # what the database and the anchor file still agree on: the rollback hides from them
    result = verify_chain(engine_witness)
    assert (result.ok, result.witnessed_seq) == (False, head.seq)
    assert result.reason.startswith(f"rolled back: the engine witnessed event #{head.seq} but the chain ends at #5")

    job = approved_job(live_engine, operator, reviewer)  # the restored console carries on
    before = live_engine.state()["fingerprint"]
    with pytest.raises(EngineRefused) as refused:
        apply_as_the_worker(job)
    assert refused.value.status == 409
    assert f"the console's audit trail went back from #{head.seq} to #" in refused.value.message
    assert "a rollback of its database" in refused.value.message
    assert live_engine.state()["fingerprint"] == before  # nothing applied

    fill(head.seq)  # the restored trail records its way past the witnessed seq: still refused
    with pytest.raises(EngineRefused, match=f"went back from #{head.seq} to #"):
        apply_as_the_worker(job)
    assert witnessed().rolled_back["from_seq"] == head.seq
    assert live_engine.state()["fingerprint"] == before


@pytest.mark.slow
def test_the_restored_consoles_worker_fails_the_job_naming_the_rollback(run_job, live_engine, operator, reviewer,
                                                                         settings):
    """Pins the worker's rule for a 409 from an engine that runs no operation (console/jobs/worker.py `_apply`): a
    refusal that waiting cannot change ends the job at once with the engine's reason. Without it the worker waited
    out SEAM_JOB_BUSY_WAIT_S and failed the job as 'the engine stayed busy'."""
    settings.SEAM_JOB_BUSY_WAIT_S = 3.0  # without the rule the job fails once this runs out, with the wrong reason
    fill(10)
    run_job()
    head = witnessed()
    restore_older_copy(5)
    cut_anchor_to(5)
    job = approved_job(live_engine, operator, reviewer)
    before = live_engine.state()["fingerprint"]
    assert worker.execute(job.pk) == "failed"
    job.refresh_from_db()
    assert job.error.startswith("the engine refused the plan (409): apply refused: the console's audit trail went "
                                f"back from #{head.seq} to #"), job.error
    assert "stayed busy" not in job.error and job.error.endswith("nothing was applied")
    assert live_engine.state()["fingerprint"] == before


# --- the holder of SEAM_AUDIT_KEY, with the database and the anchor file ----------------------------------------

@pytest.mark.slow
def test_audit_key_holder_rewriting_witnessed_events_is_caught_by_the_engine(run_job, settings):
    """The key holder re-hashes a rewritten event and everything after it and writes a fresh, valid anchor file:
    only the engine's witnessed hash still knows better (pins verification._rolled_back's hash check)."""
    fill(4)
    run_job()
    head = witnessed()
    prev_hash = AuditEvent.objects.get(seq=2).hash
    for event in AuditEvent.objects.filter(seq__gte=3).order_by("seq"):
        if event.seq == 3:
            event.payload = {"n": "rewritten"}
        forged = compute_hash(prev_hash, event_content(event))  # made under SEAM_AUDIT_KEY, as the holder can
        _sql("UPDATE audit_auditevent SET payload = %s, prev_hash = %s, hash = %s WHERE seq = %s",
             [json.dumps(event.payload), prev_hash, forged, event.seq])
        prev_hash = forged
    anchor_path().write_text("".join(canonical_json({"seq": e.seq, "hash": e.hash, "mac": anchor_mac(e.seq, e.hash),
                                                     "ts": "x"}) + "\n"
                                     for e in AuditEvent.objects.order_by("seq")))
    assert verify_chain().ok  # chain and anchor both re-made with the key
    result = verify_chain(engine_witness)
    assert result.ok is False
    assert result.reason == (f"rolled back: event #{head.seq} is not the one the engine witnessed: the database was "
                             "restored to another copy and rewritten from there on")


# --- the holder of SEAM_APPROVAL_KEY ------------------------------------------------------------------------------

def _witness_lone_trail(engine, seq: int, issued_at: float | None = None, trail: str = "5e" * 32) -> tuple:
    """Send an attestation carrying (trail, seq) for a plan the driver refuses: the engine witnesses the head (it
    checks it before the plan), and nothing is applied."""
    head = AuditHead(trail, seq, f"{seq:064x}")
    attestation = sign_attestation(engine.approval_key, "ab" * 32, 10**9 + seq, ["rita"],
                                   issued_at or time.time(), head)
    reply = engine.client.post("/control/apply", json={"plan": {}, "plan_hash": "ab" * 32,
                                                       "attestation": attestation})
    return reply, attestation


def test_approval_key_holder_cannot_move_a_witnessed_head_back(live_engine):
    """The key signs any head; the engine still keeps the newest it saw, so a signed older one is refused."""
    trail = "6f" * 32
    _witness_lone_trail(live_engine, 10, trail=trail)
    reply, _ = _witness_lone_trail(live_engine, 5, trail=trail)
    assert reply.status_code == 409 and "went back from #10 to #5" in reply.json()["error"]
    seen = live_engine.client.get("/control/audit-head", params={"trail": trail}).json()["witnessed"]
    assert (seen["seq"], seen["rolled_back"]["to_seq"]) == (10, 5)


# --- the holder of the control token ------------------------------------------------------------------------------

def test_control_token_holder_reads_the_witness_but_cannot_move_it(live_engine):
    """Pins the head under the signature: a captured attestation with its head raised is refused (403) and the
    witness stays (with the head unsigned, the engine took #99 and every later verify cried rollback)."""
    trail = "7a" * 32
    _, captured = _witness_lone_trail(live_engine, 10, trail=trail)
    assert live_engine.anonymous.get("/control/audit-head", params={"trail": trail}).status_code == 401
    raised = {**captured, "audit_head": {**captured["audit_head"], "seq": 99}}
    reply = live_engine.client.post("/control/apply", json={"plan": {}, "plan_hash": "ab" * 32,
                                                             "attestation": raised})
    assert reply.status_code == 403 and "attestation.signature does not match" in reply.json()["error"]
    seen = live_engine.client.get("/control/audit-head", params={"trail": trail}).json()["witnessed"]
    assert (seen["seq"], seen["rolled_back"]) == (10, None)
    bad = live_engine.client.get("/control/audit-head", params={"trail": "nope"})
    assert bad.status_code == 400 and "trail: expected the 64 hex digits" in bad.json()["error"]


# --- webhook receivers: witnesses outside the console and the engine ----------------------------------------------

def test_every_webhook_payload_carries_the_audit_head(operator, settings, monkeypatch):
    """Pins the head in webhooks._send: a receiver keeps it, so even an engine whose state was wiped is not the only
    witness."""
    sent = []
    monkeypatch.setattr(webhooks.deliver, "apply_async", lambda args: sent.append(args))
    settings.SEAM_WEBHOOK_URLS, settings.SEAM_WEBHOOK_KEY = ["http://127.0.0.1:9/hook"], "webhook-test-key"
    plan = {"kind": "cut", "target": {"cut": [8, 4, 4]}, "incumbent_fingerprint": "feedfacefeedface", "predicted": {}}
    job = Job.objects.create(kind="cut", target=plan["target"], plan=plan, plan_hash="ab" * 32, prediction={},
                             proposer=operator, proposer_name=operator.get_username())
    lifecycle.cancel(operator, job)
    ((_url, body, signature, _delivery, _event),) = sent
    assert webhooks.signature_matches(body.encode(), signature, "webhook-test-key")
    newest = AuditEvent.objects.order_by("-seq").first()
    assert json.loads(body)["audit_head"] == {"trail": AuditEvent.objects.get(seq=1).hash, "seq": newest.seq,
                                              "hash": newest.hash}
