"""Audit models, one concern per file."""

from console.audit.models.audit_event import GENESIS_HASH, AuditEvent, AuditEventQuerySet, ChainScheme
from console.audit.models.chain_lock import AuditChainLock

__all__ = ["GENESIS_HASH", "AuditChainLock", "AuditEvent", "AuditEventQuerySet", "ChainScheme"]
