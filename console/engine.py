"""A small typed client for the engine's control API, the only way the console reaches the engine.

    GET  /control/state                     -> EngineState
    POST /control/plan                      -> PlanReply      {kind, target, incumbent_fingerprint}
    POST /control/apply                     -> operation id   {plan, plan_hash, attestation}: 202 | 403 attestation
                                                              refused | 409 stale, busy or job id used | 422 | 400
    GET  /control/operations?plan_hash=     -> [Operation]    the operations started for one plan
    GET  /control/operations/{id}           -> Operation
    GET  /control/audit-head?trail=         -> the audit head the engine witnessed of one trail, or None
    GET  /healthz                           -> Health         200 ok | 503 unhealthy, both with the report

The replies are contracts/control.py's and contracts/plan.py's types, parsed here, once: the rest of the console reads
attributes. Every call carries the control token (`Authorization: Bearer $SEAM_ENGINE_TOKEN`,
contracts/attestation.py); an engine answers 401 without it. An apply also carries the job's approval attestation
(console.jobs.attestation).

A connection that cannot be made, or an answer that does not come in time, is EngineUnreachable (its
message names the URL and what happened); an answer the engine gives with an error status is EngineRefused
(its status and the engine's own message); an answer that does not parse is EngineError naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from django.conf import settings

from contracts.attestation import CONTROL_TOKEN_ENV, bearer_token
from contracts.control import (
    Accepted,
    EngineState,
    Health,
    Operation,
    OperationList,
    Refusal,
    Witnessed,
    WitnessedHead,
)
from contracts.errors import ContractError
from contracts.plan import PlanReply

__all__ = ["EngineClient", "EngineError", "EngineRefused", "EngineUnreachable"]

DEFAULT_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 3.0
Reply = TypeVar("Reply")


class EngineError(Exception):
    """Base of everything this client raises."""


class EngineUnreachable(EngineError):
    """No answer: the engine is down, the address is wrong, or it did not answer in time.

    `sent` is False when the request certainly never reached the engine (the connection was refused), True
    when it may have (it timed out or the connection broke after sending).
    """

    def __init__(self, message: str, sent: bool):
        super().__init__(message)
        self.sent = sent


class EngineRefused(EngineError):
    def __init__(self, status: int, message: str):
        super().__init__(f"the engine answered {status}: {message}")
        self.status = status
        self.message = message


class EngineClient:
    def __init__(self, base_url: str | None = None, timeout_s: float | None = None,
                 transport: httpx.BaseTransport | None = None, token: str | None = None):
        self.base_url = (base_url or settings.ENGINE_URL).rstrip("/")
        read = timeout_s if timeout_s is not None else getattr(settings, "SEAM_ENGINE_TIMEOUT_S", DEFAULT_TIMEOUT_S)
        token = settings.SEAM_ENGINE_TOKEN if token is None else token
        # Without a token the calls still go out: the engine's 401 then names what it wants, and _call adds ours.
        self._tokenless = not token
        self._http = httpx.Client(base_url=self.base_url, transport=transport, headers=bearer_token(token) if token
                                  else None, timeout=httpx.Timeout(read, connect=min(CONNECT_TIMEOUT_S, read)))

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- the control API -------------------------------------------------------------------------
    def state(self) -> EngineState:
        return self._parsed(EngineState.from_dict, "GET", "/control/state")

    def plan(self, kind: str, target: dict, incumbent_fingerprint: str) -> PlanReply:
        return self._parsed(PlanReply.from_dict, "POST", "/control/plan",
                            {"kind": kind, "target": target, "incumbent_fingerprint": incumbent_fingerprint})

    def apply(self, plan: dict, plan_hash: str, attestation: dict) -> str:
        """Apply the reviewed `plan` with the console's `attestation` of its review; returns the operation id."""
        return self._parsed(Accepted.from_dict, "POST", "/control/apply",
                            {"plan": plan, "plan_hash": plan_hash, "attestation": attestation}).operation_id

    def find_operations(self, plan_hash: str) -> list[Operation]:
        """The operations the engine started for `plan_hash`, oldest first: how a lost operation id is found."""
        return list(self._parsed(OperationList.from_dict, "GET", "/control/operations",
                                 params={"plan_hash": plan_hash}).operations)

    def operation(self, operation_id: str) -> Operation:
        return self._parsed(Operation.from_dict, "GET", f"/control/operations/{operation_id}")

    def audit_head(self, trail: str) -> WitnessedHead | None:
        """The newest audit head of `trail` the engine's attestations carried (engine/control/audit_witness.py), or
        None."""
        return self._parsed(Witnessed.from_dict, "GET", "/control/audit-head", params={"trail": trail}).witnessed

    def health(self) -> Health:
        """Whether the engine can serve (open, no token needed): its 503 carries the same report, `ok` false, with
        the reason, so an unhealthy engine is an answer here, not a refusal."""
        return self._parsed(Health.from_dict, "GET", "/healthz", answers={503})

    # --- plumbing --------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None, params: dict | None = None,
              answers: frozenset[int] | set[int] = frozenset()) -> Any:
        """The JSON object the engine answered; an error status not in `answers` is EngineRefused."""
        where = f"{method} {self.base_url}{path}"
        try:
            response = self._http.request(method, path, json=body, params=params)
        except httpx.ConnectError as error:
            raise EngineUnreachable(f"engine unreachable at {self.base_url}: {error}", sent=False) from error
        except httpx.ConnectTimeout as error:
            raise EngineUnreachable(f"engine unreachable at {self.base_url}: connecting timed out", sent=False) \
                from error
        except httpx.TimeoutException as error:
            raise EngineUnreachable(f"engine did not answer {where} in time ({type(error).__name__})", sent=True) \
                from error
        except httpx.TransportError as error:
            raise EngineUnreachable(f"engine connection failed during {where}: {error}", sent=True) from error
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.is_error and response.status_code not in answers:
            try:
                message = Refusal.from_dict(data).message
            except ContractError:  # not the engine's own refusal (a proxy's page, say): its text says what happened
                message = response.text[:500]
            if response.status_code == 401 and self._tokenless:
                message += f" (this console holds no control token: set {CONTROL_TOKEN_ENV} in its environment)"
            if response.status_code == 503:
                # The engine's front end answers while its driver is gone (it stops moments later): the engine is
                # down, as when nothing answers, and the call may have reached the driver before it went.
                raise EngineUnreachable(f"engine unavailable during {where}: {message}", sent=True)
            raise EngineRefused(response.status_code, message)
        if not isinstance(data, dict):
            raise EngineError(f"{where} answered {response.status_code} without a JSON object")
        return data

    def _parsed(self, parse: Callable[[Any], Reply], method: str, path: str, body: dict | None = None,
                params: dict | None = None, answers: frozenset[int] | set[int] = frozenset()) -> Reply:
        """The reply to one call as its contract type; EngineError naming the field when it does not parse."""
        data = self._call(method, path, body, params, answers)
        try:
            return parse(data)
        except ContractError as error:
            raise EngineError(f"{method} {self.base_url}{path} answered a reply that does not parse: {error}") from None
