"""The audit trail's one write path and its export; verification is re-exported from its own module.

`record` appends an event inside the caller's transaction: the event commits with the change it
records, and if the event cannot be written the exception propagates and the change rolls back. Each
event is linked to the one before it by a keyed hash (console.audit.chain), and once its transaction
commits the new head is anchored outside the database (console.audit.anchor). Appends take a row lock on
AuditChainLock, so concurrent writers queue instead of forking the chain.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from typing import Any

from django.db import connections, router, transaction
from django.db.models import QuerySet
from django.utils import timezone

from console.audit.anchor import append_anchor
from console.audit.chain import CONTENT_FIELDS, compute_hash, event_content, iso_timestamp
from console.audit.errors import AuditWriteRefused
from console.audit.models import GENESIS_HASH, AuditChainLock, AuditEvent, ChainScheme
from console.audit.request_id import current_request_id, is_sane_request_id
from console.audit.verification import VerifyResult, verify_chain
from contracts.attestation import AuditHead
from contracts.canonical import canonical_json
from contracts.errors import ContractError

__all__ = ["SYSTEM_ACTOR", "VerifyResult", "audit_head", "compute_hash", "event_content", "export_jsonl", "record",
           "verify_chain"]

SYSTEM_ACTOR = "system"
EXPORT_FIELDS = ("id", *CONTENT_FIELDS, "actor_id", "prev_hash", "hash", "scheme")
_LIMITS = {"action": AuditEvent._meta.get_field("action").max_length,
           "subject": AuditEvent._meta.get_field("subject").max_length}


# --- record ------------------------------------------------------------------------------------

def record(*, actor, action: str, subject: str, payload: dict, before: dict | None = None,
           after: dict | None = None, request_id: str | None = None) -> AuditEvent:
    """Append one event to the chain, in the caller's transaction; raises (never swallows) on any failure.

    `actor` is a saved User, or None for the system. `request_id` defaults to the current request's
    (see console.audit.request_id). Call it inside the `transaction.atomic()` that makes the change,
    so the change and its record commit or roll back together.
    """
    actor_name = _actor_name(actor)
    for name, value in (("action", action), ("subject", subject)):
        if not isinstance(value, str) or not value or len(value) > _LIMITS[name]:
            raise AuditWriteRefused(f"audit {name}: expected a non-empty string of at most {_LIMITS[name]} "
                                    f"characters, got {value!r:.80}")
    if request_id is None:
        request_id = current_request_id()
    if request_id is not None and not is_sane_request_id(request_id):
        raise AuditWriteRefused(f"audit request_id {request_id!r:.80} is not a short token of letters, digits "
                                "and ._:-")
    using = router.db_for_write(AuditEvent)
    with transaction.atomic(using=using):
        payload, before, after = _as_stored(using, payload=payload, before=before, after=after)
        _lock_chain(using)
        head = _chain_head(using)
        event = AuditEvent(
            seq=1 if head is None else head.seq + 1,
            timestamp=timezone.now(),
            actor=actor,
            actor_name=actor_name,
            action=action,
            subject=subject,
            payload=payload,
            before=before,
            after=after,
            request_id=request_id or "",
            prev_hash=GENESIS_HASH if head is None else head.hash,
            scheme=ChainScheme.HMAC_SHA256,
        )
        event.hash = compute_hash(event.prev_hash, event_content(event))
        event.save(using=using)
        # After the outermost commit only: an anchor must never name an event that rolled back.
        transaction.on_commit(partial(append_anchor, event.seq, event.hash), using=using, robust=True)
    return event


def _lock_chain(using: str) -> None:
    """Hold the chain's lock row until the caller's transaction ends (a no-op on SQLite, whose writers
    serialize anyway; a race there still cannot fork the chain, since seq is unique)."""
    AuditChainLock.objects.using(using).select_for_update().get_or_create(pk=1)


def _chain_head(using: str) -> AuditEvent | None:
    return AuditEvent.objects.using(using).order_by("-seq").only("seq", "hash").first()


def _actor_name(actor) -> str:
    if actor is None:
        return SYSTEM_ACTOR
    if not getattr(actor, "is_authenticated", False) or getattr(actor, "pk", None) is None:
        raise AuditWriteRefused(f"audit actor {actor!r:.80} is not a saved, authenticated user; "
                                "pass a User, or None for the system")
    return actor.get_username()


def _as_stored(using: str, **values: Any) -> list[Any]:
    """The values as the database will hand them back, so the hash recomputes from the stored row.

    canonical_json refuses what has no JSON form; PostgreSQL's jsonb also rewrites some numbers (1e+20
    comes back as the integer 100000000000000000000), so there the values make one round trip first.
    """
    for name, value in values.items():
        if not (isinstance(value, dict) or (value is None and name != "payload")):
            kind = "an object" if name == "payload" else "an object or None"
            raise AuditWriteRefused(f"audit {name}: expected {kind}, got {type(value).__name__}")
        try:
            canonical_json(value)
        except ContractError as error:
            raise AuditWriteRefused(f"audit {name} has no canonical JSON form: {error}") from error
    text = canonical_json(list(values.values()))
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT %s::jsonb::text", [text])
            text = cursor.fetchone()[0]
    return json.loads(text)


# --- head --------------------------------------------------------------------------------------

def audit_head() -> AuditHead:
    """The trail's newest event as witnesses outside the database keep it (the engine, through each attestation;
    webhook receivers): `trail` is the first event's hash, naming this database's trail."""
    events = AuditEvent.objects.order_by("seq").only("seq", "hash")
    first, newest = events.first(), events.last()
    if newest is None:
        return AuditHead(GENESIS_HASH, 0, GENESIS_HASH)
    return AuditHead(first.hash, newest.seq, newest.hash)


# --- export ------------------------------------------------------------------------------------

def export_jsonl(queryset: QuerySet | None = None) -> Iterator[str]:
    """One canonical JSON line (ending in a newline) per event, in seq order; every line carries its
    content, prev_hash, hash and scheme, so an export can be re-verified without the database (keyed
    events need SEAM_AUDIT_KEY)."""
    queryset = AuditEvent.objects.all() if queryset is None else queryset
    for row in queryset.order_by("seq").values(*EXPORT_FIELDS).iterator(chunk_size=2000):
        row["timestamp"] = iso_timestamp(row["timestamp"])
        yield canonical_json(row) + "\n"
