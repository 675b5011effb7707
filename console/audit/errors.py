"""What the audit trail raises. Callers catch these by type; nothing here is ever swallowed."""

from __future__ import annotations

__all__ = ["AuditError", "AuditEventImmutable", "AuditWriteRefused"]


class AuditError(Exception):
    """Base for every refusal the audit trail makes."""


class AuditEventImmutable(AuditError):
    """An update or delete of an audit event: the trail is append-only."""


class AuditWriteRefused(AuditError, ValueError):
    """An event that cannot be recorded as given (not JSON, anonymous actor, ...); the caller's change must fail."""
