"""A row changed or removed behind the ORM's back is found by verify, which names the first broken link."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.db import IntegrityError, connection, transaction

from console.audit.models import AuditEvent
from console.audit.services import compute_hash, event_content, verify_chain

pytestmark = pytest.mark.django_db
TRIGGER = "audit_auditevent_append_only"


def _raw(sql: str, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@contextmanager
def tamperable():
    """On PostgreSQL, first show the trigger refuses raw writes, then switch it off for the block."""
    if connection.vendor != "postgresql":
        yield
        return
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        _raw("UPDATE audit_auditevent SET payload = '{\"n\": 99}' WHERE seq = 3")
    _raw("SET CONSTRAINTS ALL IMMEDIATE")  # ALTER TABLE refuses while deferred FK checks are pending
    _raw(f"ALTER TABLE audit_auditevent DISABLE TRIGGER {TRIGGER}")
    try:
        yield
    finally:
        _raw(f"ALTER TABLE audit_auditevent ENABLE TRIGGER {TRIGGER}")


@pytest.mark.parametrize("assignment", [
    "payload = '{\"n\": 99}'",
    "before = NULL",
    "after = '{\"status\": \"approved\"}'",
    "action = 'job.approve'",
    "subject = 'job:999'",
    "actor_name = 'mallory'",
    "request_id = 'forged'",
])
def test_a_changed_field_breaks_its_own_link(make_events, assignment):
    make_events(5)
    with tamperable():
        _raw(f"UPDATE audit_auditevent SET {assignment} WHERE seq = 3")
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken) == (False, 2, 3)
    assert "hash does not match the event's content" in result.reason
    assert str(result).startswith("broken at event #3")


def test_a_changed_timestamp_breaks_its_own_link(make_events):
    make_events(5)
    event = AuditEvent.objects.get(seq=3)
    with tamperable():
        _raw("UPDATE audit_auditevent SET timestamp = %s WHERE seq = 3",
             [event.timestamp.replace(microsecond=(event.timestamp.microsecond + 1) % 1_000_000)])
    result = verify_chain()
    assert (result.ok, result.first_broken) == (False, 3)


def test_a_rewritten_event_with_a_recomputed_hash_breaks_the_next_link(make_events, anchor_file):
    """Re-hashed under the key itself: the anchor still names the old hash, and so does the next link."""
    make_events(5)
    event = AuditEvent.objects.get(seq=3)
    forged = event_content(event) | {"payload": {"n": 99}}
    with tamperable():
        _raw("UPDATE audit_auditevent SET payload = '{\"n\": 99}', hash = %s WHERE seq = 3",
             [compute_hash(event.prev_hash, forged)])
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken) == (False, 2, 3)
    assert "hash differs from the one anchored for event #3" in result.reason
    anchor_file.unlink()
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken) == (False, 3, 4)
    assert "prev_hash is not the hash of event #3" in result.reason


def test_a_removed_event_is_found(make_events):
    make_events(5)
    with tamperable():
        _raw("DELETE FROM audit_auditevent WHERE seq = 3")
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken) == (False, 2, 4)
    assert "seq 4 where 3 was expected" in result.reason


def test_a_cut_at_the_genesis_is_found(make_events):
    make_events(3)
    with tamperable():
        _raw("UPDATE audit_auditevent SET prev_hash = %s WHERE seq = 1", ["f" * 64])
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken) == (False, 0, 1)
    assert "genesis" in result.reason
