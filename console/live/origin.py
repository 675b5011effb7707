"""The websocket handshake's Origin check: the console's own origin (scheme, host and port), or a trusted one.

channels' AllowedHostsOriginValidator compares only the Origin's host with ALLOWED_HOSTS. Cookies are per host,
not per port, so a page served by anything else on the console's host (http://127.0.0.1:9999: another
program, another user's dev server) would open a socket carrying the operator's session and read telemetry
and jobs. This applies Django's CSRF origin rule (CsrfViewMiddleware) to the handshake instead:

* the Host header must name one of ALLOWED_HOSTS, as Django requires of every HTTP request (otherwise a
  DNS-rebound name, whose page's Origin matches its own Host, would pass);
* the Origin must equal `<scheme>://<Host>` — scheme, host and port, default ports filled in — where the scheme
  is https for a TLS socket (wss) or, behind a proxy, when SECURE_PROXY_SSL_HEADER says so, as for a request;
* or the Origin is one of CSRF_TRUSTED_ORIGINS (SEAM_CSRF_TRUSTED_ORIGINS: the proxy's public name), exactly or
  by a `https://*.example.org` wildcard, the list that already lets that origin's forms post.

A socket without an Origin is refused: every browser sends one, and a script can set it.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

__all__ = ["SameOriginValidator", "origin_refusal"]

log = logging.getLogger("seam.live")

_DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]  # scheme, host, port


class SameOriginValidator:
    """ASGI middleware for the websocket router: denies the handshake (403) unless `origin_refusal` is None."""

    def __init__(self, application) -> None:
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator guards websockets only")
        if reason := origin_refusal(scope):
            log.warning("websocket %s refused: %s", scope.get("path", ""), reason)
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)


def origin_refusal(scope: dict) -> str | None:
    """Why this websocket handshake's Origin is not acceptable, or None."""
    origin, host = _header(scope, b"origin"), _header(scope, b"host")
    if not origin:
        return "no Origin header"
    if not host:
        return "no Host header"
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, _allowed_hosts()):
        return f"Host {host[:100]!r} is not in ALLOWED_HOSTS"
    seen = _parse(origin)
    if seen is None:
        return f"Origin {origin[:100]!r} is not a scheme://host[:port] origin"
    if seen == _parse(f"{_scheme(scope)}://{host}") or _trusted(origin, seen):
        return None
    return f"Origin {origin[:100]!r} is neither this console's origin ({_scheme(scope)}://{host[:100]}) " \
           "nor one of CSRF_TRUSTED_ORIGINS"


def _header(scope: dict, name: bytes) -> str | None:
    """The header's value; None when it is missing or sent more than once (no guessing which one counts)."""
    values = [value for key, value in scope.get("headers", ()) if key.lower() == name]
    return values[0].decode("latin1") if len(values) == 1 else None


def _parse(origin: str) -> Origin | None:
    """(scheme, host, port) of a serialized origin, default port filled in; None for anything else ("null", a
    path, user info, an unknown scheme, a bad port)."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username is not None \
            or parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    return parts.scheme, parts.hostname, port or _DEFAULT_PORTS[parts.scheme]


def _scheme(scope: dict) -> str:
    """The page's scheme as Django's request.scheme would say it: the proxy's header when one is trusted,
    else the socket's own (wss -> https)."""
    if settings.SECURE_PROXY_SSL_HEADER:
        meta_name, secure_value = settings.SECURE_PROXY_SSL_HEADER
        forwarded = _header(scope, meta_name.removeprefix("HTTP_").replace("_", "-").lower().encode("latin1"))
        if forwarded is not None:
            return "https" if forwarded.split(",", 1)[0].strip() == secure_value else "http"
    return "https" if scope.get("scheme", "ws") in ("wss", "https") else "http"


def _trusted(origin: str, seen: Origin) -> bool:
    for pattern in settings.CSRF_TRUSTED_ORIGINS:
        parts = urlsplit(pattern)
        if parts.netloc.startswith("*"):  # Django's wildcard: https://*.example.org
            if parts.scheme == seen[0] and is_same_domain(urlsplit(origin).netloc.lower(), parts.netloc[1:]):
                return True
        elif _parse(pattern) == seen:
            return True
    return False


def _allowed_hosts() -> list[str]:
    # Django's own fallback when DEBUG runs with an empty ALLOWED_HOSTS (HttpRequest.get_host).
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [".localhost", "127.0.0.1", "[::1]"]
    return settings.ALLOWED_HOSTS
