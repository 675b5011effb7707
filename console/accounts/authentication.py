"""Token authentication that refuses (and deletes) a token older than SEAM_TOKEN_TTL_S."""

from __future__ import annotations

from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from console.accounts.tokens import is_expired

__all__ = ["EXPIRED_MESSAGE", "ExpiringTokenAuthentication"]

EXPIRED_MESSAGE = "token expired: POST /api/v1/auth/token/ for a new one"


class ExpiringTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, key: str):
        user, token = super().authenticate_credentials(key)
        if is_expired(token):
            # Deleted on first sight, so an expired key is gone from the database, not just refused.
            token.delete()
            raise AuthenticationFailed(EXPIRED_MESSAGE)
        return user, token
