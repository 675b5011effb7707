"""A small typed client for the engine's control API, the only way the console reaches the engine.

    GET  /control/state                 -> EngineState
    POST /control/plan                  -> PlanReply      {kind, target, incumbent_fingerprint}
    POST /control/apply                 -> operation id   202 | 409 stale or busy | 422 infeasible | 400
    GET  /control/operations/{id}       -> Operation

A connection that cannot be made, or an answer that does not come in time, is EngineUnreachable (its
message names the URL and what happened); an answer the engine gives with an error status is EngineRefused
(its status and the engine's own message).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

import httpx
from django.conf import settings

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
                 transport: httpx.BaseTransport | None = None):
        self.base_url = (base_url or settings.ENGINE_URL).rstrip("/")
        read = timeout_s if timeout_s is not None else getattr(settings, "SEAM_ENGINE_TIMEOUT_S", DEFAULT_TIMEOUT_S)
        self._http = httpx.Client(base_url=self.base_url, transport=transport,
                                  timeout=httpx.Timeout(read, connect=min(CONNECT_TIMEOUT_S, read)))

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

    def apply(self, plan: dict, plan_hash: str) -> str:
        reply = self._call("POST", "/control/apply", {"plan": plan, "plan_hash": plan_hash})
        operation_id = reply.get("operation_id")
        if not isinstance(operation_id, str) or not operation_id:
            raise EngineError(f"the engine accepted the plan but named no operation: {reply!r}")
        return operation_id

    def operation(self, operation_id: str) -> Operation:
        return self._call("GET", f"/control/operations/{operation_id}")

    # --- plumbing --------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        where = f"{method} {self.base_url}{path}"
        try:
            response = self._http.request(method, path, json=body)
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
            raise EngineRefused(response.status_code, str(message) if message else response.text[:500])
        if not isinstance(data, dict):
            raise EngineError(f"{where} answered {response.status_code} without a JSON object")
        return data
