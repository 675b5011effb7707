"""services.record builds one hash chain that verify_chain accepts; what it records is what it hashes."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import connection

from console.audit.errors import AuditWriteRefused
from console.audit.models import GENESIS_HASH, AuditEvent
from console.audit.request_id import bind_request_id
from console.audit.services import compute_hash, event_content, record, verify_chain

pytestmark = pytest.mark.django_db


def test_chain_links_each_event_to_the_one_before(make_events):
    events = make_events(5)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert events[0].prev_hash == GENESIS_HASH
    for before, after in zip(events, events[1:], strict=False):
        assert after.prev_hash == before.hash
    for event in events:
        assert event.hash == compute_hash(event.prev_hash, event_content(event))
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken, result.reason) == (True, 5, None, None)
    assert (result.anchored_seq, result.legacy_events) == (5, 0)
    assert str(result) == "ok: 5 events; anchored at event #5"


def test_empty_trail_verifies():
    assert verify_chain().ok and verify_chain().checked == 0


def test_stored_row_rehashes_to_its_hash(make_events):
    make_events(2)
    for event in AuditEvent.objects.all():  # fresh from the database
        assert event.hash == compute_hash(event.prev_hash, event_content(event))


def test_actor_is_kept_as_a_link_and_as_frozen_text(django_user_model):
    alice = django_user_model.objects.create_user("alice")
    event = record(actor=alice, action="job.approve", subject="job:7", payload={"reason": "ok"})
    system = record(actor=None, action="job.reconcile", subject="job:7", payload={})
    assert (event.actor_id, event.actor_name) == (alice.pk, "alice")
    assert (system.actor_id, system.actor_name) == (None, "system")
    alice.username = "alice2"
    alice.save()
    assert AuditEvent.objects.get(pk=event.pk).actor_name == "alice"


def test_deleting_the_actor_keeps_the_event_and_its_name(django_user_model, django_capture_on_commit_callbacks):
    bob = django_user_model.objects.create_user("bob")
    with django_capture_on_commit_callbacks(execute=True):  # anchored, as after a real commit
        event = record(actor=bob, action="job.cancel", subject="job:3", payload={})
    bob.delete()  # ON DELETE SET NULL: the one change the PostgreSQL trigger lets through
    event = AuditEvent.objects.get(pk=event.pk)
    assert (event.actor_id, event.actor_name) == (None, "bob")
    assert verify_chain().ok


def test_json_values_hash_as_the_database_returns_them(django_capture_on_commit_callbacks):
    # jsonb rewrites 1e+20 as an integer; a tuple is stored as a list; non-ASCII text is escaped in the hash.
    payload = {"big": 1e20, "tiny": 1e-7, "half": 0.5, "huge_int": 2**70, "text": "caf\u00e9 \u2603",
               "pair": (1, 2), "nested": {"b": [True, None], "a": -0.0}}
    with django_capture_on_commit_callbacks(execute=True):  # anchored, as after a real commit
        event = record(actor=None, action="plan.price", subject="plan:x", payload=payload, after={"v": 1.0})
    stored = AuditEvent.objects.get(pk=event.pk)
    assert stored.payload == event.payload and stored.after == event.after
    assert stored.hash == compute_hash(stored.prev_hash, event_content(stored))
    assert verify_chain().ok


def test_request_id_comes_from_the_argument_or_the_current_request():
    explicit = record(actor=None, action="a.b", subject="s", payload={}, request_id="req-1")
    with bind_request_id("req-2"):
        ambient = record(actor=None, action="a.b", subject="s", payload={})
    none = record(actor=None, action="a.b", subject="s", payload={})
    assert (explicit.request_id, ambient.request_id, none.request_id) == ("req-1", "req-2", "")
    assert verify_chain().checked == 3


@pytest.mark.parametrize(("fields", "message"), [
    ({"payload": {"s": {1, 2}}}, "payload has no canonical JSON form"),
    ({"payload": {1: "x"}}, "payload has no canonical JSON form"),
    ({"payload": {"x": float("nan")}}, "payload has no canonical JSON form"),
    ({"payload": ["not", "an", "object"]}, "payload: expected an object"),
    ({"before": "text"}, "before: expected an object or None"),
    ({"action": ""}, "action: expected a non-empty string"),
    ({"action": "x" * 65}, "action: expected a non-empty string of at most 64"),
    ({"subject": 42}, "subject: expected a non-empty string"),
    ({"request_id": "two words"}, "request_id"),
    ({"actor": AnonymousUser()}, "not a saved, authenticated user"),
])
def test_unrecordable_events_are_refused(fields, message):
    kwargs = {"actor": None, "action": "job.propose", "subject": "job:1", "payload": {}} | fields
    with pytest.raises(AuditWriteRefused, match=message):
        record(**kwargs)
    assert AuditEvent.objects.count() == 0


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL refuses NUL in text; SQLite stores it")
def test_postgresql_refusing_a_value_raises_from_record():
    with pytest.raises(Exception, match="(?i)unicode|\\\\u0000|null"):
        record(actor=None, action="a.b", subject="s", payload={"x": "nul\x00"})
