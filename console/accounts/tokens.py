"""API tokens with a lifetime (SEAM_TOKEN_TTL_S, from their `created`), stored hashed (console.accounts.models).

Every issue makes a new secret, returned once: the database cannot give it back. It replaces the user's previous
token (one per user), so a key that leaked stops working at the latest one TTL after it was issued, or when its
holder logs in again. Issuing and revoking are audited, in the transaction that makes the change, naming the token
by its prefix.
"""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from console.accounts.models import ApiToken, prefix_of, token_digest
from console.audit.services import record

__all__ = ["IssuedToken", "expires_at", "is_expired", "issue_token", "revoke_tokens"]

# 32 random bytes, URL-safe base64: 43 characters.
_SECRET_BYTES = 32


@dataclass(frozen=True)
class IssuedToken:
    """A token just issued: the stored row and its secret, which exists only here."""

    token: ApiToken
    secret: str


def expires_at(token: ApiToken) -> dt.datetime:
    return token.created + dt.timedelta(seconds=settings.SEAM_TOKEN_TTL_S)


def is_expired(token: ApiToken, now: dt.datetime | None = None) -> bool:
    return (now or timezone.now()) >= expires_at(token)


def _subject(user) -> str:
    return f"user:{user.get_username()}"


def _new_secret() -> str:
    while True:  # prefixes are unique: on the rare clash (48 random bits) with a stored one, draw again
        secret = secrets.token_urlsafe(_SECRET_BYTES)
        if not ApiToken.objects.filter(prefix=prefix_of(secret)).exists():
            return secret


def issue_token(user) -> IssuedToken:
    """A new token for `user`, replacing the one they had (live or expired)."""
    with transaction.atomic():
        # The user's row is the lock: two logins at once replace one another in turn, never clash on the insert.
        get_user_model().objects.select_for_update().get(pk=user.pk)
        old = ApiToken.objects.filter(user=user).first()
        if old is not None:
            old.delete()
        secret = _new_secret()
        token = ApiToken.objects.create(user=user, prefix=prefix_of(secret), digest=token_digest(secret))
        record(actor=user, action="auth.token_issued", subject=_subject(user),
               payload={"prefix": token.prefix, "replaced": old.prefix if old else None,
                        "expires_at": expires_at(token).isoformat()})
    return IssuedToken(token=token, secret=secret)


def revoke_tokens(user, *, actor, reason: str) -> int:
    """Delete the user's token; returns how many there were (0 or 1). `actor` is who revoked it (None: the
    system, e.g. on a password change)."""
    with transaction.atomic():
        prefix = ApiToken.objects.filter(user=user).values_list("prefix", flat=True).first()
        deleted, _ = ApiToken.objects.filter(user=user).delete()
        record(actor=actor, action="auth.token_revoked", subject=_subject(user),
               payload={"tokens": deleted, "prefix": prefix, "reason": reason})
    return deleted
