"""Token authentication against hashed tokens (console.accounts.models): `Authorization: Token <secret>` finds its
row by the secret's prefix, is checked against the stored hash in constant time, and is refused (and deleted) once
older than SEAM_TOKEN_TTL_S."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from console.accounts.models import ApiToken, prefix_of
from console.accounts.tokens import is_expired

__all__ = ["EXPIRED_MESSAGE", "ExpiringTokenAuthentication"]

EXPIRED_MESSAGE = "token expired: POST /api/v1/auth/token/ for a new one"


class ExpiringTokenAuthentication(TokenAuthentication):
    """DRF's header parsing and answers (401 with `WWW-Authenticate: Token`, its messages), Seam's token store."""

    def authenticate_credentials(self, key: str) -> tuple[object, ApiToken]:
        token = ApiToken.objects.select_related("user").filter(prefix=prefix_of(key)).first()
        if token is None or not token.matches(key):
            raise AuthenticationFailed(_("Invalid token."))
        if not token.user.is_active:
            raise AuthenticationFailed(_("User inactive or deleted."))
        if is_expired(token):
            # Deleted on first sight, so an expired token is gone from the database, not just refused.
            token.delete()
            raise AuthenticationFailed(EXPIRED_MESSAGE)
        return token.user, token
