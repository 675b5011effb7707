"""API tokens with a lifetime: DRF's Token, whose `created` gives its age (SEAM_TOKEN_TTL_S).

A token is never refreshed in place: rotation deletes the old key and creates a new one, so a key that
leaked stops working at the latest one TTL after it was issued. Issuing and revoking are audited, in the
transaction that makes the change.
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework.authtoken.models import Token

from console.audit.services import record

__all__ = ["expires_at", "is_expired", "issue_token", "revoke_tokens"]


def expires_at(token: Token) -> dt.datetime:
    return token.created + dt.timedelta(seconds=settings.SEAM_TOKEN_TTL_S)


def is_expired(token: Token, now: dt.datetime | None = None) -> bool:
    return (now or timezone.now()) >= expires_at(token)


def _subject(user) -> str:
    return f"user:{user.get_username()}"


def issue_token(user) -> Token:
    """The user's live token, or a fresh one when they have none or theirs expired (rotation)."""
    with transaction.atomic():
        token = Token.objects.select_for_update().filter(user=user).first()
        if token is not None and not is_expired(token):
            return token
        rotated = token is not None
        if rotated:
            token.delete()
        token = Token.objects.create(user=user)
        record(actor=user, action="auth.token_issued", subject=_subject(user),
               payload={"replaced_expired": rotated, "expires_at": expires_at(token).isoformat()})
    return token


def revoke_tokens(user, *, actor, reason: str) -> int:
    """Delete the user's token; returns how many there were (0 or 1). `actor` is who revoked it (None: the
    system, e.g. on a password change)."""
    with transaction.atomic():
        deleted, _ = Token.objects.filter(user=user).delete()
        record(actor=actor, action="auth.token_revoked", subject=_subject(user),
               payload={"tokens": deleted, "reason": reason})
    return deleted
