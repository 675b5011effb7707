"""Audit events cannot be changed or removed through the ORM, nor (on PostgreSQL) through raw SQL."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from console.audit.errors import AuditEventImmutable
from console.audit.models import AuditEvent
from console.audit.services import verify_chain

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigger is PostgreSQL only")


def test_saving_an_existing_event_is_refused(make_events):
    event = make_events(1)[0]
    event.payload = {"n": 99}
    with pytest.raises(AuditEventImmutable, match="append-only"):
        event.save()
    fresh = AuditEvent.objects.get(pk=event.pk)
    fresh.action = "job.approve"
    with pytest.raises(AuditEventImmutable):
        fresh.save(update_fields=["action"])
    assert AuditEvent.objects.get(pk=event.pk).payload == {"n": 1}


def test_deleting_an_event_is_refused(make_events):
    event = make_events(1)[0]
    with pytest.raises(AuditEventImmutable, match="append-only"):
        event.delete()
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_queryset_update_and_delete_are_refused(make_events):
    make_events(2)
    with pytest.raises(AuditEventImmutable):
        AuditEvent.objects.filter(seq=1).update(payload={"n": 99})
    with pytest.raises(AuditEventImmutable):
        AuditEvent.objects.all().delete()
    with pytest.raises(AuditEventImmutable):
        AuditEvent.objects.update(action="x")
    events = list(AuditEvent.objects.all())
    for event in events:
        event.action = "x"
    with pytest.raises(AuditEventImmutable):
        AuditEvent.objects.bulk_update(events, ["action"])
    assert AuditEvent.objects.count() == 2 and verify_chain().ok


def test_rows_enter_only_through_the_service():
    with pytest.raises(AuditEventImmutable, match="services.record"):
        AuditEvent.objects.create(seq=1, action="a", subject="s", actor_name="x")
    with pytest.raises(AuditEventImmutable, match="bulk_create"):
        AuditEvent.objects.bulk_create([AuditEvent(seq=1)])
    assert AuditEvent.objects.count() == 0


def _raw(sql: str, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@postgresql_only
@pytest.mark.parametrize("sql", [
    "UPDATE audit_auditevent SET payload = '{\"n\": 99}' WHERE seq = 1",
    "UPDATE audit_auditevent SET hash = repeat('0', 64) WHERE seq = 1",
    "DELETE FROM audit_auditevent WHERE seq = 1",
    "DELETE FROM audit_auditevent",
])
def test_postgresql_trigger_refuses_raw_update_and_delete(make_events, sql):
    make_events(2)
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        _raw(sql)
    assert AuditEvent.objects.count() == 2 and verify_chain().ok


@postgresql_only
def test_postgresql_trigger_lets_only_set_null_of_the_actor_through(make_events, django_user_model):
    carol = django_user_model.objects.create_user("carol")
    dave = django_user_model.objects.create_user("dave")
    make_events(1, actor=carol)
    for sql, params in [
        ("UPDATE audit_auditevent SET actor_id = %s WHERE seq = 1", [dave.pk]),  # re-pointing the actor
        ("UPDATE audit_auditevent SET actor_id = NULL, actor_name = 'eve' WHERE seq = 1", []),
    ]:
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
            _raw(sql, params)
    _raw("UPDATE audit_auditevent SET actor_id = NULL WHERE seq = 1")
    assert AuditEvent.objects.get(seq=1).actor_name == "carol" and verify_chain().ok
