"""The token endpoint's request and answer."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from rest_framework import serializers
from rest_framework.authtoken.serializers import AuthTokenSerializer

__all__ = ["IssuedTokenSerializer", "TokenRequestSerializer"]


User = get_user_model()


class TokenRequestSerializer(AuthTokenSerializer):
    # No longer than a username can be, as on the login page's form: what reaches authenticate() is stored by
    # django-axes as typed, in a column of bounded length (a longer one would fail the insert on PostgreSQL).
    username = serializers.CharField(label="Username", write_only=True,
                                     max_length=User._meta.get_field(User.USERNAME_FIELD).max_length)


class IssuedTokenSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="The secret: send it as `Authorization: Token <token>`. Shown this once; "
                                            "the console keeps only its hash, so keep it now.")
    prefix = serializers.CharField(help_text="The token's first characters, not secret: what names it afterwards "
                                             "(the audit trail, the admin's list).")
    expires_at = serializers.DateTimeField(
        help_text="When the token stops working (SEAM_TOKEN_TTL_S after it was issued); POST again for a new one.")
