"""The audit trail's one write path, its verification and its export (ARCHITECTURE.md, "Audit trail").

`record` appends an event inside the caller's transaction: the event commits with the change it
records, and if the event cannot be written the exception propagates and the change rolls back. Each
event is linked to the one before it: `hash = sha256(prev_hash + canonical JSON of its content)`, with
`solvers.plans.canonical_json` as the one canonical form. Appends take a row lock on AuditChainLock,
so concurrent writers queue instead of forking the chain.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connections, router, transaction
from django.db.models import QuerySet
from django.utils import timezone

from console.audit.errors import AuditWriteRefused
from console.audit.models import GENESIS_HASH, AuditChainLock, AuditEvent
from console.audit.request_id import current_request_id, is_sane_request_id
from solvers.errors import SolverError
from solvers.plans import canonical_json

__all__ = ["SYSTEM_ACTOR", "VerifyResult", "compute_hash", "event_content", "export_jsonl", "record",
           "verify_chain"]

SYSTEM_ACTOR = "system"
# What the hash covers, in this order of meaning (canonical JSON sorts the keys anyway).
CONTENT_FIELDS = ("seq", "actor_name", "action", "subject", "payload", "before", "after", "request_id", "timestamp")
EXPORT_FIELDS = ("id", *CONTENT_FIELDS, "actor_id", "prev_hash", "hash")
_LIMITS = {"action": AuditEvent._meta.get_field("action").max_length,
           "subject": AuditEvent._meta.get_field("subject").max_length}


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    checked: int  # events whose links verified, in seq order
    first_broken: int | None  # seq of the first event whose link is broken
    reason: str | None

    def __str__(self) -> str:
        if self.ok:
            return f"ok: {self.checked} events"
        return f"broken at event #{self.first_broken} after {self.checked} good events: {self.reason}"


# --- content and hash --------------------------------------------------------------------------

def _iso(timestamp: dt.datetime | str) -> str:
    if isinstance(timestamp, str):  # already ISO (an exported line)
        return timestamp
    return timestamp.astimezone(dt.UTC).isoformat(timespec="microseconds")


def event_content(event: AuditEvent | Mapping[str, Any]) -> dict[str, Any]:
    """What the hash covers, from a model instance, a `values()` row or an exported line."""
    get = event.get if isinstance(event, Mapping) else lambda name: getattr(event, name)
    content = {name: get(name) for name in CONTENT_FIELDS}
    content["timestamp"] = _iso(content["timestamp"])
    return content


def compute_hash(prev_hash: str, content: Mapping[str, Any]) -> str:
    return hashlib.sha256((prev_hash + canonical_json(content)).encode("ascii")).hexdigest()


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
        )
        event.hash = compute_hash(event.prev_hash, event_content(event))
        event.save(using=using)
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
        except SolverError as error:
            raise AuditWriteRefused(f"audit {name} has no canonical JSON form: {error}") from error
    text = canonical_json(list(values.values()))
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT %s::jsonb::text", [text])
            text = cursor.fetchone()[0]
    return json.loads(text)


# --- verify and export -------------------------------------------------------------------------

def _rows(queryset: QuerySet | None, fields: Iterable[str]) -> Iterator[dict[str, Any]]:
    queryset = AuditEvent.objects.all() if queryset is None else queryset
    return queryset.order_by("seq").values(*fields).iterator(chunk_size=2000)


def verify_chain() -> VerifyResult:
    """Walk the whole chain from the genesis, recompute every hash, and name the first broken link."""
    prev_hash, expected, checked = GENESIS_HASH, 1, 0
    for row in _rows(None, (*CONTENT_FIELDS, "id", "prev_hash", "hash")):
        seq = row["seq"]
        where = "the genesis value" if expected == 1 else f"the hash of event #{expected - 1}"
        if seq != expected:
            reason = f"seq {seq} where {expected} was expected: events are missing or out of order"
        elif not hmac.compare_digest(row["prev_hash"], prev_hash):
            reason = f"prev_hash is not {where}: the chain was cut or an earlier event rewritten"
        else:
            try:
                recomputed = compute_hash(prev_hash, event_content(row))
            except SolverError as error:
                reason = f"content cannot be hashed ({error})"
            else:
                reason = None if hmac.compare_digest(recomputed, row["hash"]) else (
                    "hash does not match the event's content: the row was changed after it was recorded")
        if reason is not None:
            return VerifyResult(False, checked, seq, f"event #{seq} (id {row['id']}): {reason}")
        prev_hash, expected, checked = row["hash"], expected + 1, checked + 1
    return VerifyResult(True, checked, None, None)


def export_jsonl(queryset: QuerySet | None = None) -> Iterator[str]:
    """One canonical JSON line (ending in a newline) per event, in seq order; every line carries its
    content, prev_hash and hash, so an export can be re-verified without the database."""
    for row in _rows(queryset, EXPORT_FIELDS):
        row["timestamp"] = _iso(row["timestamp"])
        yield canonical_json(row) + "\n"
