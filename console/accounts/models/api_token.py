"""An API token as stored: whose it is, a prefix that names it, and a hash of its secret — never the secret.

The secret is shown once, in the answer that issues it (console.accounts.tokens). It is 32 random bytes, so a plain
SHA-256 is as strong as a slow or keyed hash against whoever reads the table: there is no guessable input to try.
The prefix (its first characters) is not secret: it finds the row, and it is what listings and the audit trail show.
"""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings
from django.db import models
from django.utils import timezone

__all__ = ["PREFIX_LENGTH", "ApiToken", "prefix_of", "token_digest"]

PREFIX_LENGTH = 8


def token_digest(secret: str) -> str:
    """The stored form of a secret: SHA-256, hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def prefix_of(secret: str) -> str:
    return secret[:PREFIX_LENGTH]


class ApiToken(models.Model):
    # One token per user, as DRF's Token had: issuing a new one replaces the old.
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_token")
    prefix = models.CharField(max_length=PREFIX_LENGTH, unique=True,
                              help_text="The secret's first characters: names the token, finds its row.")
    digest = models.CharField(max_length=64, help_text="SHA-256 of the whole secret, hex.")
    created = models.DateTimeField(default=timezone.now, help_text="When it was issued; its age sets its expiry.")

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    def matches(self, secret: str) -> bool:
        """Whether `secret` is this token's, compared in constant time."""
        return hmac.compare_digest(self.digest, token_digest(secret))
