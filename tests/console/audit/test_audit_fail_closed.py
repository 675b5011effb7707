"""The audit event commits with the change it records: a failed audit write fails the change."""

from __future__ import annotations

from unittest import mock

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, transaction

from console.audit import services
from console.audit.errors import AuditWriteRefused
from console.audit.models import AuditEvent
from console.audit.services import record, verify_chain

pytestmark = pytest.mark.django_db(transaction=True)
User = get_user_model()


def _create_user_and_record(username: str, payload: dict):
    with transaction.atomic():
        user = User.objects.create_user(username)
        record(actor=None, action="user.create", subject=f"user:{user.pk}", payload=payload)


def test_an_unserialisable_payload_rolls_the_change_back():
    with pytest.raises(AuditWriteRefused):
        _create_user_and_record("frank", {"when": object()})
    assert not User.objects.filter(username="frank").exists()
    assert AuditEvent.objects.count() == 0


def test_a_database_error_in_the_audit_write_rolls_the_change_back(make_events):
    make_events(2)
    with mock.patch.object(AuditEvent, "save", side_effect=DatabaseError("disk full")), \
            pytest.raises(DatabaseError, match="disk full"):
        _create_user_and_record("grace", {})
    assert not User.objects.filter(username="grace").exists()
    assert AuditEvent.objects.count() == 2 and verify_chain().ok


def test_a_failure_while_locking_the_chain_rolls_the_change_back():
    with mock.patch.object(services, "_lock_chain", side_effect=DatabaseError("lock timeout")), \
            pytest.raises(DatabaseError):
        _create_user_and_record("heidi", {})
    assert not User.objects.filter(username="heidi").exists()


def test_a_change_rolled_back_later_takes_its_event_with_it():
    with pytest.raises(RuntimeError), transaction.atomic():
        record(actor=None, action="job.approve", subject="job:1", payload={})
        raise RuntimeError("the change failed after its event was written")
    assert AuditEvent.objects.count() == 0
    event = record(actor=None, action="job.approve", subject="job:1", payload={})
    assert event.seq == 1 and verify_chain().ok


def test_a_committed_change_has_its_event():
    _create_user_and_record("ivan", {"role": "viewer"})
    assert User.objects.filter(username="ivan").exists()
    assert AuditEvent.objects.get().payload == {"role": "viewer"}
