"""Issue 13, item 4: an intruder with write access to the database (not to SEAM_AUDIT_KEY, not to the anchor file)
deletes the newest audit events, or rewrites one and re-hashes the rest; verify reports both.

Events are recorded through the service and their on-commit anchors run as after a real commit; the tampering is
raw SQL, below the ORM's guards. On PostgreSQL the append-only trigger first refuses it, then is switched off as
the table's owner could.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from contextlib import contextmanager

import pytest
from django.db import IntegrityError, connection, transaction

from console.audit.anchor import AnchorState
from console.audit.chain import event_content
from console.audit.models import GENESIS_HASH, AuditEvent, ChainScheme
from console.audit.services import record, verify_chain
from contracts.canonical import canonical_json

pytestmark = pytest.mark.django_db
TRIGGER = "audit_auditevent_append_only"


@pytest.fixture
def trail(django_capture_on_commit_callbacks):
    """Five committed, anchored events."""
    with django_capture_on_commit_callbacks(execute=True):
        for n in range(1, 6):
            record(actor=None, action="job.approve", subject=f"job:{n}", payload={"n": n})


def _sql(sql: str, params=()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@contextmanager
def as_the_table_owner():
    """On PostgreSQL: the trigger refuses a raw DELETE; the owner switches it off for the block."""
    if connection.vendor != "postgresql":
        yield
        return
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        _sql("DELETE FROM audit_auditevent WHERE seq = 5")
    _sql("SET CONSTRAINTS ALL IMMEDIATE")  # ALTER TABLE refuses while deferred FK checks are pending
    _sql(f"ALTER TABLE audit_auditevent DISABLE TRIGGER {TRIGGER}")
    try:
        yield
    finally:
        _sql(f"ALTER TABLE audit_auditevent ENABLE TRIGGER {TRIGGER}")


def _plain_sha256(prev_hash: str, content: dict) -> str:
    return hashlib.sha256((prev_hash + canonical_json(content)).encode("ascii")).hexdigest()


def _hmac_under(key: bytes) -> Callable[[str, dict], str]:
    return lambda prev_hash, content: hmac.new(key, (prev_hash + canonical_json(content)).encode("ascii"),
                                               hashlib.sha256).hexdigest()


def _rewrite_and_rehash(seq: int, hasher: Callable[[str, dict], str], scheme: str | None = None) -> None:
    """Set event `seq`'s payload to {"n": 99} and re-link it and every later event with `hasher`, as an intruder
    would so that each link still holds; `scheme` also rewrites the rows' scheme column."""
    prev_hash = GENESIS_HASH if seq == 1 else AuditEvent.objects.get(seq=seq - 1).hash
    with as_the_table_owner():
        for event in AuditEvent.objects.filter(seq__gte=seq).order_by("seq"):
            if event.seq == seq:
                event.payload = {"n": 99}
            forged = hasher(prev_hash, event_content(event))
            _sql("UPDATE audit_auditevent SET payload = %s, prev_hash = %s, hash = %s, scheme = %s WHERE seq = %s",
                 [json.dumps(event.payload), prev_hash, forged, scheme or event.scheme, event.seq])
            prev_hash = forged


# --- (a) truncation ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kept", [3, 0])
def test_deleting_the_newest_events_is_reported_at_the_anchored_seq(trail, kept):
    with as_the_table_owner():
        _sql("DELETE FROM audit_auditevent WHERE seq > %s", [kept])
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken, result.anchored_seq) == (False, kept, kept + 1, 5)
    assert f"the anchor file names event #5 but the chain ends at #{kept}" in result.reason
    assert str(result).startswith(f"broken at event #{kept + 1} after {kept} good events")


# --- (b) rewrite and re-hash ------------------------------------------------------------------------------------

def test_a_rewrite_rehashed_with_plain_sha256_is_reported(trail):
    _rewrite_and_rehash(3, _plain_sha256)
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken) == (False, 2, 3)
    assert "hash does not match the event's content under SEAM_AUDIT_KEY" in result.reason


def test_a_rewrite_rehashed_under_a_wrong_key_is_reported(trail):
    _rewrite_and_rehash(3, _hmac_under(b"a key the intruder guessed"))
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken) == (False, 2, 3)
    assert "hash does not match the event's content under SEAM_AUDIT_KEY" in result.reason


def test_a_rewrite_downgraded_to_the_unkeyed_scheme_is_reported(trail):
    _rewrite_and_rehash(3, _plain_sha256, scheme=ChainScheme.SHA256)
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken) == (False, 2, 3)
    assert "unkeyed sha256 after keyed event #1" in result.reason


def test_a_whole_trail_downgraded_and_rehashed_is_caught_by_the_anchor(trail):
    """Every row re-hashed as unkeyed sha256 is a self-consistent legacy chain; only the anchor still knows better."""
    _rewrite_and_rehash(1, _plain_sha256, scheme=ChainScheme.SHA256)
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken) == (False, 0, 1)
    assert "hash differs from the one anchored for event #1" in result.reason


def test_a_rewrite_rehashed_by_a_key_holder_is_caught_by_the_anchor(trail, settings):
    _rewrite_and_rehash(4, _hmac_under(settings.SEAM_AUDIT_KEY.encode()))
    result = verify_chain()
    assert (result.ok, result.checked, result.first_broken) == (False, 3, 4)
    assert "hash differs from the one anchored for event #4" in result.reason


# --- (c) intact -------------------------------------------------------------------------------------------------

def test_an_intact_trail_verifies_anchored_at_its_head(trail):
    result = verify_chain()
    head = AuditEvent.objects.order_by("-seq").first().seq
    assert (result.ok, result.checked, result.first_broken, result.reason) == (True, 5, None, None)
    assert (result.anchor, result.anchored_seq, head, result.legacy_events) == (AnchorState.ANCHORED, 5, 5, 0)
    assert str(result) == "ok: 5 events; anchored at event #5"
