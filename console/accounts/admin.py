"""The admin's list of API tokens: whose, named by prefix, issued and expiring when. The secret is not stored, so
there is nothing more to show; tokens are issued by POST /api/v1/auth/token/ only, and deleting one here revokes it
through the service, audited like any revocation."""

from __future__ import annotations

import datetime as dt

from django.contrib import admin

from console.accounts.models import ApiToken
from console.accounts.tokens import expires_at, revoke_tokens

__all__ = ["ApiTokenAdmin"]

_REASON = "revoked in the admin"


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "created", "expires")
    fields = ("prefix", "user", "created")
    search_fields = ("prefix", "user__username")

    @admin.display(description="expires")
    def expires(self, token: ApiToken) -> dt.datetime:
        return expires_at(token)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def delete_model(self, request, obj: ApiToken) -> None:
        revoke_tokens(obj.user, actor=request.user, reason=_REASON)

    def delete_queryset(self, request, queryset) -> None:
        for token in queryset.select_related("user"):
            revoke_tokens(token.user, actor=request.user, reason=_REASON)
