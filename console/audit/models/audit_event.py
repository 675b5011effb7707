"""AuditEvent: one append-only, hash-chained row per recorded change.

Rows are written only by `console.audit.services.record`. Updates and deletes are refused here (model
and queryset) and, on PostgreSQL, by a trigger (migration 0002) that also catches raw SQL. Each row names
the scheme its hash was made with (console.audit.chain): keyed for every new row, plain sha256 for rows
recorded before the chain was keyed.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from console.audit.errors import AuditEventImmutable

__all__ = ["GENESIS_HASH", "AuditEvent", "AuditEventQuerySet", "ChainScheme"]

# prev_hash of the first event: there is nothing before it.
GENESIS_HASH = "0" * 64


class ChainScheme(models.TextChoices):
    """How an event's hash was made. Verify refuses a legacy row after a keyed one: a downgrade, not history."""

    SHA256 = "sha256", "sha256 (unkeyed: recorded before the chain was keyed)"
    HMAC_SHA256 = "hmac-sha256", "HMAC-SHA256 under SEAM_AUDIT_KEY"


_APPEND_ONLY = "the audit trail is append-only: {what} is refused; record a new event instead"


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AuditEventImmutable(_APPEND_ONLY.format(what="QuerySet.update() of audit events"))

    def delete(self):
        raise AuditEventImmutable(_APPEND_ONLY.format(what="QuerySet.delete() of audit events"))

    def bulk_update(self, objs, fields, batch_size=None):
        raise AuditEventImmutable(_APPEND_ONLY.format(what="bulk_update() of audit events"))

    def bulk_create(self, objs, *args, **kwargs):
        raise AuditEventImmutable("audit events are appended one at a time by console.audit.services.record; "
                                  "bulk_create() would bypass the hash chain")


class AuditEvent(models.Model):
    seq = models.PositiveBigIntegerField(unique=True, editable=False, help_text="Position in the chain, from 1.")
    timestamp = models.DateTimeField(editable=False)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="audit_events", editable=False)
    actor_name = models.CharField(max_length=150, editable=False,
                                  help_text="The actor's username when the event was recorded; 'system' for none.")
    action = models.CharField(max_length=64, db_index=True, editable=False)
    subject = models.CharField(max_length=255, db_index=True, editable=False)
    payload = models.JSONField(default=dict, editable=False)
    before = models.JSONField(null=True, blank=True, editable=False)
    after = models.JSONField(null=True, blank=True, editable=False)
    request_id = models.CharField(max_length=64, blank=True, default="", db_index=True, editable=False)
    prev_hash = models.CharField(max_length=64, editable=False)
    hash = models.CharField(max_length=64, unique=True, editable=False)
    scheme = models.CharField(max_length=16, choices=ChainScheme.choices, editable=False,
                              help_text="How `hash` was made; not itself hashed (a downgrade is caught by verify).")

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["seq"]
        verbose_name = "audit event"

    def __str__(self) -> str:
        return f"#{self.seq} {self.actor_name} {self.action} {self.subject}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AuditEventImmutable(_APPEND_ONLY.format(what=f"saving existing audit event #{self.seq}"))
        if not self.hash or not self.prev_hash:
            raise AuditEventImmutable("audit events are appended by console.audit.services.record, "
                                      "which links them into the hash chain")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AuditEventImmutable(_APPEND_ONLY.format(what=f"deleting audit event #{self.seq}"))
