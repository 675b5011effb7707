"""Who may call what on the engine's HTTP service, and with which credential (docs/engine.md, "Trust model").

- /control/* needs the control token (`Authorization: Bearer $SEAM_ENGINE_TOKEN`). An engine started without
  one keeps its control API closed: an open one would let anyone who reaches the port change the layout.
- /control/apply needs, beside the token, the console's attestation of the plan's review, checked with the
  approval key (contracts/attestation.py); each job's attestation starts one operation, once, even across restarts
  (engine/control/job_ledger.py).
- /v1/* needs the API key only where one is set (as vLLM's --api-key).
- /healthz and /metrics stay open: liveness probes and Prometheus scrapers carry no secrets, and neither
  answer carries one.
- `engine serve` on an address other than loopback refuses to start without an API key, unless told
  (--allow-open-v1) that /v1 is open on purpose.

The secrets come from the environment only (argv shows in `ps`), into one `Credentials`.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.attestation import API_KEY_ENV, APPROVAL_KEY_ENV, CONTROL_TOKEN_ENV, Attestation, verify_attestation
from contracts.errors import ContractError
from engine.control.protocol import ApplyRefused
from engine.errors import EngineError

__all__ = ["Credentials", "Unauthorized", "attested", "exposure_notices", "is_loopback", "require_api_key",
           "require_control_token"]


@dataclass(frozen=True)
class Credentials:
    """The engine's secrets; None where unset. Kept out of repr so a logged object leaks nothing."""

    control_token: str | None = field(default=None, repr=False)
    approval_key: str | None = field(default=None, repr=False)
    api_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Credentials:
        return cls(environ.get(CONTROL_TOKEN_ENV) or None, environ.get(APPROVAL_KEY_ENV) or None,
                   environ.get(API_KEY_ENV) or None)


class Unauthorized(Exception):
    """A 401: `challenge` is the WWW-Authenticate header, which names what to send."""

    def __init__(self, message: str, challenge: str):
        super().__init__(message)
        self.challenge = challenge


def _presented(headers: Mapping[str, str]) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _require_bearer(headers: Mapping[str, str], secret: str, realm: str, env: str) -> None:
    fix = f"send Authorization: Bearer <the {env} this engine was started with>"
    challenge = f'Bearer realm="{realm}", error_description="{fix}"'
    presented = _presented(headers)
    if presented is None:
        raise Unauthorized(f"{realm} needs a bearer token: {fix}", challenge)
    # Compared as bytes: compare_digest refuses str with non-ASCII characters, which a header may carry.
    if not hmac.compare_digest(presented.encode(), secret.encode()):
        raise Unauthorized(f"the bearer token is wrong for {realm}: {fix}", challenge + ', error="invalid_token"')


def require_control_token(credentials: Credentials, headers: Mapping[str, str]) -> None:
    """Unauthorized unless the request carries this engine's control token."""
    if credentials.control_token is None:
        raise Unauthorized(f"this engine was started without {CONTROL_TOKEN_ENV}, so its control API is closed: "
                           f"restart it with {CONTROL_TOKEN_ENV} set in its environment (make run generates one)",
                           f'Bearer realm="the control API", error_description="start the engine with '
                           f'{CONTROL_TOKEN_ENV} set"')
    _require_bearer(headers, credentials.control_token, "the control API", CONTROL_TOKEN_ENV)


def require_api_key(credentials: Credentials, headers: Mapping[str, str]) -> None:
    """Unauthorized when an API key is set and the request does not carry it."""
    if credentials.api_key is not None:
        _require_bearer(headers, credentials.api_key, "the OpenAI API", API_KEY_ENV)


def attested(credentials: Credentials, attestation: Any, plan_hash: str, now: float) -> Attestation:
    """The verified attestation that `plan_hash` passed a console's review; ApplyRefused(403) saying why not."""
    if credentials.approval_key is None:
        raise ApplyRefused(403, "this engine holds no approval key: it applies only plans a console attested; "
                                f"set {APPROVAL_KEY_ENV}")
    try:
        return verify_attestation(credentials.approval_key, attestation, plan_hash, now)
    except ContractError as error:
        raise ApplyRefused(403, f"apply refused: {error}") from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name (or "" for every interface): reachable from elsewhere, as far as we know
        return False


def exposure_notices(host: str, credentials: Credentials, allow_open_v1: bool) -> list[str]:
    """Lines telling the operator who can reach what; EngineError when /v1 would be open beyond this machine
    without the operator saying so."""
    notices = []
    if credentials.control_token is None:
        notices.append(f"notice: {CONTROL_TOKEN_ENV} is not set, so the control API (/control/*) is closed (401); "
                       "set it in the engine's environment to let a console drive this engine")
    if credentials.api_key is None and not is_loopback(host):
        if not allow_open_v1:
            raise EngineError(f"--host {host} serves /v1 beyond this machine without an API key: set {API_KEY_ENV} "
                              "in the engine's environment, or pass --allow-open-v1 to serve /v1 unauthenticated "
                              "on purpose")
        notices.append(f"WARNING: /v1 is served WITHOUT authentication on {host} (--allow-open-v1): anyone who "
                       f"reaches this port can generate; set {API_KEY_ENV} to require a key")
    return notices
