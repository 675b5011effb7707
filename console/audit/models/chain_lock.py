"""AuditChainLock: the single row every append locks, so two writers cannot fork the chain."""

from __future__ import annotations

from django.db import models

__all__ = ["AuditChainLock"]


class AuditChainLock(models.Model):
    """One row (pk=1), locked with SELECT ... FOR UPDATE for the rest of the appending transaction.

    It holds no state: the chain's head is always the AuditEvent with the highest seq. It exists so
    the very first append has a row to lock too (an empty audit table has no "latest row").
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)

    class Meta:
        verbose_name = "audit chain lock"
