"""What an audit event's hash covers and how it is made (docs/architecture.md §5).

`hash = HMAC-SHA256(SEAM_AUDIT_KEY, prev_hash + canonical JSON of the event's content)`, with
`contracts.canonical.canonical_json` as the one canonical form. The key lives outside the database (settings,
from the environment), so someone who can write the database but lacks the key cannot rewrite an event
and re-hash the rest of the chain: verify recomputes under the key and names the first row that does not
match. Rows recorded before the chain was keyed carry `scheme = sha256` and hash without a key.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from console.audit.models import AuditEvent, ChainScheme
from contracts.canonical import canonical_json

__all__ = ["CONTENT_FIELDS", "chain_key", "compute_hash", "event_content", "iso_timestamp"]

# What the hash covers, in this order of meaning (canonical JSON sorts the keys anyway).
CONTENT_FIELDS = ("seq", "actor_name", "action", "subject", "payload", "before", "after", "request_id", "timestamp")


def chain_key() -> bytes:
    """SEAM_AUDIT_KEY as bytes, read on every use so a test's settings override takes effect."""
    key = getattr(settings, "SEAM_AUDIT_KEY", "")
    if not key:
        raise ImproperlyConfigured("settings.SEAM_AUDIT_KEY is empty: the audit chain cannot be keyed; set the "
                                   "SEAM_AUDIT_KEY environment variable")
    return key.encode("utf-8")


def iso_timestamp(timestamp: dt.datetime | str) -> str:
    if isinstance(timestamp, str):  # already ISO (an exported line)
        return timestamp
    return timestamp.astimezone(dt.UTC).isoformat(timespec="microseconds")


def event_content(event: AuditEvent | Mapping[str, Any]) -> dict[str, Any]:
    """What the hash covers, from a model instance, a `values()` row or an exported line."""
    get = event.get if isinstance(event, Mapping) else lambda name: getattr(event, name)
    content = {name: get(name) for name in CONTENT_FIELDS}
    content["timestamp"] = iso_timestamp(content["timestamp"])
    return content


def compute_hash(prev_hash: str, content: Mapping[str, Any], *, scheme: str = ChainScheme.HMAC_SHA256,
                 key: bytes | None = None) -> str:
    """The link hash under `scheme`; `key` defaults to SEAM_AUDIT_KEY (tests pass a wrong one to forge)."""
    message = (prev_hash + canonical_json(content)).encode("ascii")
    if scheme == ChainScheme.SHA256:
        return hashlib.sha256(message).hexdigest()
    if scheme == ChainScheme.HMAC_SHA256:
        return hmac.new(chain_key() if key is None else key, message, hashlib.sha256).hexdigest()
    raise ValueError(f"unknown audit hash scheme {scheme!r}")
