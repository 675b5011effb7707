"""What a locked-out login is told. The login pages get django-axes' own answer (AxesMiddleware renders
AXES_LOCKOUT_TEMPLATE with status 429); the token API gets this exception, in the API's error shape.

axes flags the request it was handed; DRF's token view hands authenticate() DRF's Request, whose attributes
AxesMiddleware (which holds Django's request) never sees, so the token view turns the flag into this answer.
"""

from __future__ import annotations

from axes.helpers import get_client_ip_address
from axes.utils import reset
from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException

__all__ = ["LockedOut", "clear_failures", "is_locked_out"]


def is_locked_out(request) -> bool:
    """Whether django-axes refused (or just locked) the login this request attempted."""
    return bool(getattr(request, "axes_locked_out", False))


def clear_failures(request, user) -> None:
    """A successful token login clears the username + address's failures, as AXES_RESET_ON_SUCCESS does for
    the pages: axes hears of a page login through `user_logged_in`, which a token login never sends."""
    reset(ip=get_client_ip_address(request), username=user.get_username())


class LockedOut(APIException):
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = "locked_out"

    def __init__(self) -> None:
        # DRF's handler sends `wait` as Retry-After: the lock lifts that long after the failure that set it.
        self.wait = settings.SEAM_LOGIN_COOLOFF_S
        super().__init__({
            "detail": f"locked out: {settings.SEAM_LOGIN_FAILURE_LIMIT} failed logins for this username from this "
                      f"address; every login is refused, even with the right password, for {self.wait} s",
            "code": "LockedOut"})
