"""Receivers: failed logins and lockouts go to the audit trail; a password change drops the user's API tokens.

django-axes counts failures through the same `user_login_failed` signal (its receiver is connected first:
axes precedes this app in INSTALLED_APPS), so by the time ours runs the request says whether it was locked.
"""

from __future__ import annotations

import logging

from axes.helpers import get_client_ip_address
from axes.signals import user_locked_out
from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.db.models.signals import post_save, pre_save
from django.dispatch import receiver
from django.http import HttpRequest
from rest_framework.request import Request

from console.accounts.models import ApiToken
from console.accounts.tokens import revoke_tokens
from console.audit.services import record

__all__ = ["audit_lockout", "audit_login_failure", "drop_tokens_on_password_change", "note_password_change",
           "typed_username"]

log = logging.getLogger("seam.accounts")

# Audit subjects hold what was typed, which an attacker chooses: printable characters only, and short.
_USERNAME_CHARS = 100


def typed_username(value: object) -> str:
    text = "" if value is None else str(value)
    return "".join(c if c.isprintable() else "?" for c in text[:_USERNAME_CHARS])


def _where(request: HttpRequest | Request | None) -> dict:
    if request is None:  # authenticate() called outside a request (a shell): nothing more to say
        return {"channel": "none", "ip": None, "path": None}
    # The token API hands authenticate() DRF's Request; the login pages (console and admin) Django's own.
    channel = "token-api" if isinstance(request, Request) else "page"
    return {"channel": channel, "ip": get_client_ip_address(request), "path": request.path[:200]}


def _record_refusal(action: str, subject: str, payload: dict) -> None:
    """Record an event about a refused login. A login that was refused stays refused whatever happens here, so a
    failed audit write is logged (with its request id) rather than turned into a 500 on the login answer."""
    try:
        record(actor=None, action=action, subject=subject, payload=payload)
    except Exception:
        log.exception("could not audit %s for %s", action, subject)


@receiver(user_login_failed, dispatch_uid="seam-audit-login-failed")
def audit_login_failure(sender, credentials: dict, request: HttpRequest | Request | None = None, **kwargs) -> None:
    """One `auth.login_failed` event per refused login; never the password (Django has masked it anyway)."""
    username = typed_username(credentials.get("username"))
    payload = {**_where(request), "locked_out": bool(getattr(request, "axes_locked_out", False))}
    _record_refusal("auth.login_failed", f"user:{username}", payload)


@receiver(user_locked_out, dispatch_uid="seam-audit-locked-out")
def audit_lockout(sender, request: HttpRequest | Request, username: str | None, ip_address: str | None,
                  **kwargs) -> None:
    """`auth.locked_out` once, on the failure that reached the limit. axes sends this signal again for every
    attempt refused while locked; those carry no failure count (AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT
    is off, so axes does not count them) and are already recorded as `auth.login_failed` with locked_out."""
    failures = getattr(request, "axes_failures_since_start", None)
    if failures is None:
        return
    _record_refusal("auth.locked_out", f"user:{typed_username(username)}",
                    {**_where(request), "failures": failures, "cooloff_s": settings.SEAM_LOGIN_COOLOFF_S})


@receiver(pre_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="seam-note-password-change")
def note_password_change(sender, instance, raw: bool = False, update_fields=None, **kwargs) -> None:
    """Compare the stored hash with the one about to be saved: any way of changing a password (set_password,
    the admin's form, `manage.py changepassword`, a hash assigned directly) changes it."""
    instance._seam_password_changed = False
    if raw or instance.pk is None or (update_fields is not None and "password" not in update_fields):
        return
    # Django's check_password re-hashes the same password with newer parameters at login and marks it so
    # (it clears _password before saving only the password): not a change of password.
    rehash = update_fields is not None and set(update_fields) == {"password"}
    if rehash and getattr(instance, "_password", None) is None:
        return
    stored = sender._default_manager.filter(pk=instance.pk).values_list("password", flat=True).first()
    instance._seam_password_changed = stored is not None and stored != instance.password


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="seam-drop-tokens-on-password-change")
def drop_tokens_on_password_change(sender, instance, created: bool = False, **kwargs) -> None:
    """Whoever held a token issued under the old password loses it with the password."""
    if not getattr(instance, "_seam_password_changed", False):
        return
    instance._seam_password_changed = False
    if ApiToken.objects.filter(user=instance).exists():
        revoke_tokens(instance, actor=None, reason="password changed")
