"""The chain is keyed with SEAM_AUDIT_KEY; unkeyed events from before the key verify, are counted, and may not
follow a keyed one."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from django.db import connection
from django.utils import timezone

from console.audit.chain import compute_hash, event_content
from console.audit.models import GENESIS_HASH, AuditEvent, ChainScheme
from console.audit.services import verify_chain
from contracts.canonical import canonical_json

pytestmark = pytest.mark.django_db


def _legacy_events(n: int) -> list[AuditEvent]:
    """n events as the console recorded them before the chain was keyed: plain sha256, scheme 'sha256'."""
    events, prev_hash = [], GENESIS_HASH
    for seq in range(1, n + 1):
        event = AuditEvent(seq=seq, timestamp=timezone.now(), actor_name="system", action="job.propose",
                           subject=f"job:{seq}", payload={"n": seq}, prev_hash=prev_hash, scheme=ChainScheme.SHA256)
        event.hash = compute_hash(prev_hash, event_content(event), scheme=ChainScheme.SHA256)
        event.save()
        events.append(event)
        prev_hash = event.hash
    return events


def test_a_new_event_is_hmac_sha256_under_the_key(make_events, settings):
    event = make_events(1)[0]
    message = (event.prev_hash + canonical_json(event_content(event))).encode("ascii")
    assert event.scheme == ChainScheme.HMAC_SHA256
    assert event.hash == hmac.new(settings.SEAM_AUDIT_KEY.encode(), message, hashlib.sha256).hexdigest()
    assert event.hash != hashlib.sha256(message).hexdigest()


def test_legacy_events_verify_and_are_counted(make_events):
    _legacy_events(3)
    make_events(2)  # the first keyed append links onto the legacy head
    result = verify_chain()
    assert (result.ok, result.checked, result.legacy_events, result.anchored_seq) == (True, 5, 3, 5)
    assert result.verdict == "ok: 5 events (3 unkeyed, recorded before the chain was keyed)"


def test_a_legacy_event_after_a_keyed_one_is_refused(make_events):
    _legacy_events(2)
    keyed = make_events(1)[0]
    forged = AuditEvent(seq=4, timestamp=timezone.now(), actor_name="system", action="job.approve", subject="job:4",
                        payload={}, prev_hash=keyed.hash, scheme=ChainScheme.SHA256)
    forged.hash = compute_hash(forged.prev_hash, event_content(forged), scheme=ChainScheme.SHA256)
    forged.save()
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken, result.legacy_events) == (False, 3, 4, 2)
    assert "unkeyed sha256 after keyed event #3" in result.reason


def test_an_unknown_scheme_is_refused(make_events):
    make_events(2)
    with connection.cursor() as cursor:  # no trigger to pass: the scheme column is read, not hashed
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER audit_auditevent_append_only")
        cursor.execute("UPDATE audit_auditevent SET scheme = 'md5' WHERE seq = 2")
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER audit_auditevent_append_only")
    result = verify_chain()
    assert (result.ok, result.first_broken) == (False, 2) and "unknown hash scheme 'md5'" in result.reason


def test_a_trail_verified_under_another_key_breaks_at_its_first_keyed_event(make_events, settings):
    _legacy_events(1)
    make_events(2)
    settings.SEAM_AUDIT_KEY = "a-different-key-" * 3
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken) == (False, 1, 2)
    assert "recorded under another SEAM_AUDIT_KEY" in result.reason

