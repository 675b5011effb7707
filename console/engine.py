"""A small typed client for the engine's control API, the only way the console reaches the engine.

    GET  /control/state                     -> EngineState
    POST /control/plan                      -> PlanReply      {kind, target, incumbent_fingerprint}
    POST /control/apply                     -> operation id   {plan, plan_hash, attestation}: 202 | 403 attestation
                                                              refused | 409 stale, busy or job id used | 422 | 400
    GET  /control/operations?plan_hash=     -> [Operation]    the operations started for one plan
    GET  /control/operations/{id}           -> Operation
    GET  /control/audit-head?trail=         -> the audit head the engine witnessed of one trail, or None

Every call carries the control token (`Authorization: Bearer $SEAM_ENGINE_TOKEN`, contracts/attestation.py); an
engine answers 401 without it. An apply also carries the job's approval attestation (console.jobs.attestation).

A connection that cannot be made, or an answer that does not come in time, is EngineUnreachable (its
message names the URL and what happened); an answer the engine gives with an error status is EngineRefused
(its status and the engine's own message).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

import httpx
from django.conf import settings

from contracts.attestation import CONTROL_TOKEN_ENV, bearer_token

__all__ = ["EngineClient", "EngineError", "EngineRefused", "EngineState", "EngineUnreachable", "Operation",
           "PlanReply", "OPERATION_DONE"]

DEFAULT_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 3.0
OPERATION_DONE = frozenset({"succeeded", "failed", "rolled_back"})


class EngineState(TypedDict):
    fingerprint: str
    cut: list[int]
    shape: dict[str, Any]
    phase: str
    ranks: list[dict[str, Any]]
    ladder: dict[str, Any]
    pool_tokens: NotRequired[int | None]
    boot_id: NotRequired[str]  # fresh at each start of the engine: another one means it restarted


class PlanReply(TypedDict):
    plan: dict[str, Any]
    plan_hash: str
    feasible: bool
    reasons: list[str]


class Operation(TypedDict):
    id: str
    status: str  # queued | running | succeeded | failed | rolled_back
    phase: str
    progress: float
    predicted: dict[str, Any] | None
    measured: dict[str, Any] | None
    error: str | None
    previous: NotRequired[dict[str, Any] | None]
    plan_hash: NotRequired[str]
    job_id: NotRequired[int | None]  # the console job whose attestation started it


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
        return self._call("GET", "/control/state")

    def plan(self, kind: str, target: dict, incumbent_fingerprint: str) -> PlanReply:
        return self._call("POST", "/control/plan", {"kind": kind, "target": target,
                                                    "incumbent_fingerprint": incumbent_fingerprint})

    def apply(self, plan: dict, plan_hash: str, attestation: dict) -> str:
        """Apply the reviewed `plan` with the console's `attestation` of its review; returns the operation id."""
        reply = self._call("POST", "/control/apply", {"plan": plan, "plan_hash": plan_hash,
                                                      "attestation": attestation})
        operation_id = reply.get("operation_id")
        if not isinstance(operation_id, str) or not operation_id:
            raise EngineError(f"the engine accepted the plan but named no operation: {reply!r}")
        return operation_id

    def find_operations(self, plan_hash: str) -> list[Operation]:
        """The operations the engine started for `plan_hash`, oldest first: how a lost operation id is found."""
        reply = self._call("GET", "/control/operations", params={"plan_hash": plan_hash})
        operations = reply.get("operations")
        if not isinstance(operations, list) or not all(isinstance(op, dict) for op in operations):
            raise EngineError(f"the engine's operations of plan {plan_hash[:16]} are not a list: {reply!r:.200}")
        return operations

    def operation(self, operation_id: str) -> Operation:
        return self._call("GET", f"/control/operations/{operation_id}")

    def audit_head(self, trail: str) -> dict[str, Any] | None:
        """The newest audit head of `trail` the engine's attestations carried (engine/control/audit_witness.py), or
        None."""
        reply = self._call("GET", "/control/audit-head", params={"trail": trail})
        head = reply.get("witnessed")
        if head is not None and not (isinstance(head, dict) and type(head.get("seq")) is int
                                     and isinstance(head.get("hash"), str)):
            raise EngineError(f"the engine's witnessed audit head is not {{seq, hash, ...}}: {reply!r:.200}")
        return head

    # --- plumbing --------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None, params: dict | None = None) -> Any:
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
        if response.is_error:
            message = data.get("error") if isinstance(data, dict) else None
            message = str(message) if message else response.text[:500]
            if response.status_code == 401 and self._tokenless:
                message += f" (this console holds no control token: set {CONTROL_TOKEN_ENV} in its environment)"
            raise EngineRefused(response.status_code, message)
        if not isinstance(data, dict):
            raise EngineError(f"{where} answered {response.status_code} without a JSON object")
        return data
