"""What a web page could send to /v1, refused: another Host (DNS rebinding) and a body not labelled JSON.

A page on any site can make the visitor's browser POST to http://127.0.0.1:8100/v1/completions: with
`Content-Type: text/plain` (or none) it is a "simple" request, sent without asking the engine first (no CORS
preflight). And a page whose name the attacker re-points at 127.0.0.1 (DNS rebinding) may even read the answers,
its requests carrying the attacker's name as Host. Without an API key /v1 holds nothing to stop either, so:

- /v1 answers only the Host names it serves under (421 otherwise): localhost, 127.0.0.1, [::1], the address the
  engine is bound to unless it is a wildcard, and those the operator adds with `--allowed-hosts` ("*": any);
- a /v1 POST must say `Content-Type: application/json` (415 otherwise), which a page can send only after a CORS
  preflight the engine never grants.

/control needs neither: its bearer token is a header no page can add unasked, and a console may reach the engine
under any name. Starlette's TrustedHostMiddleware would guard every route, answer plain text without the fix, and
split "[::1]:8100" at its first colon.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from engine.serve.openai_api import ApiError

__all__ = ["AllowedHosts", "host_name", "require_json"]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
ANY_HOST = "*"
JSON_MEDIA_TYPE = "application/json"


def host_name(host: str) -> str:
    """`host` as Host headers name it, port dropped: lower case, no trailing dot, an IPv6 address in brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[:host.find("]") + 1] or host
    name, colon, port = host.rpartition(":")
    if colon and ":" not in name and port.isdigit():
        host = name  # "name:8100"; a bare IPv6 address has more than one colon
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]"
    except ValueError:
        pass
    return host.rstrip(".")


@dataclass(frozen=True)
class AllowedHosts:
    """The Host names /v1 answers to."""

    names: frozenset[str] = frozenset(LOOPBACK_NAMES)

    @classmethod
    def for_bind(cls, bind: str, extra: Iterable[str] = ()) -> AllowedHosts:
        """Loopback, the bound address unless it is a wildcard (every interface: no one name of its own), and
        `extra` (the operator's --allowed-hosts)."""
        names = set(LOOPBACK_NAMES) | {host_name(name) for name in extra}
        if not _wildcard(bind):
            names.add(host_name(bind))
        return cls(frozenset(names))

    def require(self, headers: Mapping[str, str]) -> None:
        """ApiError(421) unless the request's Host is one of the names."""
        if ANY_HOST in self.names:
            return
        host = headers.get("host", "")
        name = host_name(host)
        if name not in self.names:
            raise ApiError(f"Host {host!r} is not a name this engine serves /v1 under (it answers to "
                           f"{', '.join(sorted(self.names))}), so a web page re-pointing its own name here is refused: "
                           f"call the engine by one of those or, if {name or '<name>'} is your name for it, start it "
                           f"with --allowed-hosts {name or '<name>'}",
                           status=421)


def _wildcard(bind: str) -> bool:
    try:
        return ipaddress.ip_address(bind).is_unspecified
    except ValueError:
        return not bind  # "" binds every interface too


def require_json(headers: Mapping[str, str]) -> None:
    """ApiError(415) unless the body is labelled application/json (parameters such as charset may follow)."""
    content_type = headers.get("content-type", "")
    if content_type.partition(";")[0].strip().lower() != JSON_MEDIA_TYPE:
        got = repr(content_type) if content_type else "none"
        raise ApiError(f"Content-Type must be {JSON_MEDIA_TYPE} (got {got}): the body is JSON, and a page on another "
                       "site can send any other type without the browser asking first", status=415)
