"""The engine's HTTP service: OpenAI-compatible generation, the control API, Prometheus metrics.

It only translates HTTP to the `Driver` surface (engine/control/protocol.py), whose replies are contracts/ types
written with their `to_dict()`. Every driver call may block (locks,
rank round trips), so each runs on a worker thread; waiting for tokens is the event loop's
(engine/serve/token_stream.py:
the driver's emit wakes the stream), so a thousand open streams hold no threads and a slow one never starves the
control API.

Who may call what is engine/serve/access.py's: each route names its gate (control token, API key, or open), checked
before the handler reads the body; /v1's gate also refuses what a web page could send (engine/serve/cross_site.py: 421,
415). Every JSON body is read within bounds (engine/serve/json_body.py: 413, 400), and a text prompt too long to fit
max_model_len is refused before it is tokenized (400).

Errors are JSON and never carry a traceback: `{"error": {"message", "type", "param"}}` under /v1 (OpenAI's
shape), `{"error": "..."}` elsewhere. Unexpected exceptions answer 500 with a short message; the traceback
goes to the log.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from anyio import to_thread
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from contracts.control import Accepted, OperationList, Refusal, Witnessed
from contracts.errors import ContractError
from engine.control.audit_witness import AuditWitness
from engine.control.job_ledger import JobLedger
from engine.control.protocol import ApplyRefused, Driver, DriverUnavailable, RequestHandle
from engine.errors import EngineError, EngineRequestError
from engine.serve.access import Credentials, Unauthorized, attested, require_api_key, require_control_token
from engine.serve.cross_site import AllowedHosts, require_json
from engine.serve.json_body import DEFAULT_MAX_BODY_BYTES, read_json_object
from engine.serve.openai_api import (
    ApiError,
    Choice,
    GenerationRequest,
    Reply,
    error_body,
    parse_chat,
    parse_completion,
    read_chat_max_tokens,
)
from engine.serve.token_stream import TokenStreams
from engine.telemetry.exposition import service_registry
from solvers.errors import SolverError

log = logging.getLogger(__name__)

_HASH = re.compile(r"[0-9a-fA-F]{64}")

Handler = Callable[[Request], Awaitable[Response]]
Gate = Callable[[Request], None]  # raises Unauthorized when the request may not reach the route


def _error(request: Request, status: int, message: str, param: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    openai = request.url.path.startswith("/v1/")
    body = error_body(message, status, param) if openai else Refusal(message).to_dict()
    return JSONResponse(body, status_code=status, headers=headers)


def _guarded(handler: Handler, gate: Gate) -> Handler:
    """Pass the route's gate, then map every refusal to its status and every surprise to a clean 500."""

    async def endpoint(request: Request) -> Response:
        try:
            gate(request)
            return await handler(request)
        except Unauthorized as error:
            return _error(request, 401, str(error), headers={"WWW-Authenticate": error.challenge})
        except ApiError as error:
            return _error(request, error.status, error.message, error.param)
        except ApplyRefused as error:
            return _error(request, error.status, str(error))
        except DriverUnavailable as error:
            return _error(request, 503, str(error))
        except (EngineRequestError, ContractError, SolverError) as error:
            return _error(request, 400, str(error))
        except Exception as error:
            log.exception("%s %s failed", request.method, request.url.path)
            return _error(request, 500, f"internal error ({type(error).__name__}); the engine log has the details")

    return endpoint


async def _http_error(request: Request, error: Exception) -> Response:
    # The router's own 404 and 405 (with its Allow header), in the same shapes as every other error.
    assert isinstance(error, HTTPException)
    message = {404: f"no route {request.url.path}",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(error.status_code, error.detail)
    return _error(request, error.status_code, message, headers=error.headers)


async def _run(function: Callable[..., Any], *args: Any, limiter: anyio.CapacityLimiter | None = None) -> Any:
    return await to_thread.run_sync(function, *args, limiter=limiter)


def _failure(choice: Choice) -> ApiError | None:
    """Why the choice's request failed; None when it ended well (or a stop string ended it, and the engine only
    heard of it after)."""
    handle = choice.handle
    if choice.stopped:
        return None
    if handle.finish_reason == "refused":
        return ApiError(handle.error or "the engine refused the request")
    if handle.error:
        return ApiError(f"generation failed: {handle.error}", status=500)
    return None


class _Service:
    """The handlers and their gates, bound to one driver and the engine's credentials."""

    def __init__(self, driver: Driver, credentials: Credentials, max_body_bytes: int, jobs: JobLedger,
                 allowed_hosts: AllowedHosts, witness: AuditWitness, chat_max_tokens: int):
        self.driver = driver
        self.chat_max_tokens = chat_max_tokens
        self.credentials = credentials
        self.max_body_bytes = max_body_bytes
        self.jobs = jobs
        self.allowed_hosts = allowed_hosts
        self.witness = witness
        # Control and metrics calls get threads of their own: under load generation fills the default pool,
        # and an operator must still be able to see and change the layout.
        self.control_threads = anyio.CapacityLimiter(4)
        self.registry = service_registry(driver)

    def control_gate(self, request: Request) -> None:
        require_control_token(self.credentials, request.headers)

    def api_gate(self, request: Request) -> None:
        self.allowed_hosts.require(request.headers)  # first: a rebinding page learns nothing, not even the 401
        require_api_key(self.credentials, request.headers)
        if request.method == "POST":
            require_json(request.headers)

    async def _control(self, function: Callable[..., Any], *args: Any) -> Any:
        return await _run(function, *args, limiter=self.control_threads)

    async def _api_body(self, request: Request) -> dict[str, Any]:
        return await read_json_object(request, self.max_body_bytes)

    async def _control_body(self, request: Request) -> dict[str, Any]:
        return await read_json_object(request, self.max_body_bytes, self.control_threads)

    async def _cancel(self, handle: RequestHandle, reason: str = "cancelled") -> None:
        # The client went away (or a stop string matched: reason "stop"): free the request's slots if the driver
        # can (`cancel` is optional).
        cancel = getattr(self.driver, "cancel", None)
        if cancel is not None:
            with anyio.CancelScope(shield=True):
                await _run(cancel, handle.request_id, reason)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    def _tokenized(self, body: dict[str, Any], chat: bool) -> tuple[GenerationRequest, list[int]]:
        """The parsed request and its prompt's token ids. Rendering a chat and tokenizing cost CPU in proportion to
        the prompt, so this runs on a worker thread; a prompt too long to fit is refused before the tokenizer."""
        driver = self.driver
        parsed = parse_chat(body, driver.model_name) if chat else parse_completion(body, driver.model_name)
        if not isinstance(parsed.prompt, str):
            return parsed, parsed.prompt
        parsed.check_prompt_chars(driver.max_prompt_chars(), driver.max_model_len)
        try:
            return parsed, driver.encode(parsed.prompt)
        except EngineError as error:  # no tokenizer: the client must send token ids
            raise ApiError(str(error), parsed.prompt_field) from None

    def _submit(self, prompt: list[int], parsed: GenerationRequest) -> list[RequestHandle]:
        """One engine request per choice; if one is refused, those already admitted are cancelled."""
        handles: list[RequestHandle] = []
        try:
            for params in parsed.params(len(prompt), self.driver.max_model_len, self.chat_max_tokens):
                handles.append(self.driver.submit(prompt, params))
        except BaseException:
            cancel = getattr(self.driver, "cancel", None)
            for handle in handles if cancel is not None else ():
                cancel(handle.request_id)
            raise
        return handles

    async def _generate(self, request: Request, chat: bool) -> Response:
        driver = self.driver
        body = await self._api_body(request)
        parsed, prompt = await _run(self._tokenized, body, chat)
        handles = await _run(self._submit, prompt, parsed)
        streams = TokenStreams(handles)
        choices = [Choice(i, handle, driver.decode, parsed.stop) for i, handle in enumerate(handles)]
        reply = Reply(chat=chat, model=driver.model_name, decode=driver.decode,
                      logprobs=parsed.sampling["logprobs"] is not None)
        if parsed.stream:
            return StreamingResponse(self._events(streams, choices, reply, parsed.include_usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        texts = [""] * len(choices)
        try:
            async for index, batch in streams.batches(request):
                choice = choices[index]
                if batch is None:
                    texts[index] += choice.flush()
                    continue
                if choice.stopped:
                    continue  # tokens the engine made before it heard of the stop
                texts[index] += choice.push(batch)
                if choice.stopped:
                    await self._cancel(choice.handle, "stop")
        finally:
            for index in set(range(len(choices))) - streams.ended:  # the client went away
                await self._cancel(choices[index].handle)
        for choice in choices:
            failure = _failure(choice)
            if failure:
                raise failure
        return JSONResponse(reply.whole(choices, texts, len(handles[0].prompt_ids)))

    async def _events(self, streams: TokenStreams, choices: list[Choice], reply: Reply,
                      include_usage: bool) -> AsyncIterator[str]:
        """Server-sent events: one chunk per batch of new tokens of a choice, a last one per choice with its finish
        reason, [DONE]. Text is decoded on the loop: a few tokens' window costs microseconds, a thread hop more."""
        try:
            if reply.chat:
                for choice in choices:
                    yield _sse(reply.chunk(choice, "", 0, role=True))
            async for index, batch in streams.batches():
                choice = choices[index]
                if batch is None:
                    failure = _failure(choice)
                    if failure:
                        yield _sse(error_body(failure.message, failure.status))
                    elif not choice.stopped:
                        yield _sse(reply.chunk(choice, choice.flush(), len(choice.token_ids), choice.finish_reason))
                    continue
                if choice.stopped:
                    continue  # tokens the engine made before it heard of the stop
                start = len(choice.token_ids)
                text = choice.push(batch)
                yield _sse(reply.chunk(choice, text, start, "stop" if choice.stopped else None))
                if choice.stopped:
                    await self._cancel(choice.handle, "stop")
            if include_usage:
                yield _sse(reply.usage_chunk(len(choices[0].handle.prompt_ids),
                                             sum(len(choice.token_ids) for choice in choices)))
        except Exception as error:  # the status line is sent: all that is left is to say so in the stream
            log.exception("stream %s failed", reply.id)
            yield _sse(error_body(f"internal error ({type(error).__name__}); the engine log has the details", 500))
        finally:
            for index in set(range(len(choices))) - streams.ended:
                await self._cancel(choices[index].handle)
        yield "data: [DONE]\n\n"

    def _model(self) -> dict[str, Any]:
        return {"id": self.driver.model_name, "object": "model", "created": 0, "owned_by": "seam",
                "max_model_len": self.driver.max_model_len}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        if model_id != self.driver.model_name:
            raise ApiError(f"the model {model_id!r} does not exist; this engine serves {self.driver.model_name!r}",
                           "model", 404)
        return JSONResponse(self._model())

    async def state(self, request: Request) -> Response:
        state = await self._control(self.driver.state)
        return JSONResponse(state.to_dict())

    async def plan(self, request: Request) -> Response:
        reply = await self._control(self.driver.plan, await self._control_body(request))
        return JSONResponse(reply.to_dict())

    async def apply(self, request: Request) -> Response:
        body = await self._control_body(request)
        unknown = sorted(set(body) - {"plan", "plan_hash", "attestation"})
        if unknown:
            raise ApiError(f"unrecognized field {unknown[0]}: send {{plan, plan_hash, attestation}}")
        if not isinstance(body.get("plan"), dict):
            raise ApiError("plan is missing or not an object: send the plan exactly as /control/plan returned it")
        if not isinstance(body.get("plan_hash"), str) or not body["plan_hash"]:
            raise ApiError("plan_hash is missing or not a string: send the plan_hash /control/plan returned")
        # The token says who may talk to the engine; the attestation says this very plan passed a review.
        attestation = attested(self.credentials, body.get("attestation"), body["plan_hash"], time.time())
        # Before the job id is spent: a console whose audit trail went back applies nothing.
        self.witness.witness(attestation)
        with self.jobs.claim(attestation):
            operation_id = await self._control(self.driver.apply, body["plan"], body["plan_hash"],
                                               attestation.job_id)
        return JSONResponse(Accepted(operation_id).to_dict(), status_code=202,
                            headers={"Location": f"/control/operations/{operation_id}"})

    async def audit_head(self, request: Request) -> Response:
        """The newest audit head witnessed of ?trail= (null when none), or of every trail."""
        trail = request.query_params.get("trail")
        if trail is None:
            return JSONResponse({"trails": [head.to_dict() for head in self.witness.heads()]})
        if not _HASH.fullmatch(trail):
            raise ApiError("trail: expected the 64 hex digits of the console's first audit event's hash, as "
                           "/control/audit-head?trail=<hash>")
        return JSONResponse(Witnessed(self.witness.head(trail.lower())).to_dict())

    async def find_operations(self, request: Request) -> Response:
        plan_hash = request.query_params.get("plan_hash", "")
        if not _HASH.fullmatch(plan_hash):
            raise ApiError("plan_hash: expected the 64 hex digits /control/plan returned, as "
                           "/control/operations?plan_hash=<hash>")
        found = await self._control(self.driver.find_operations, plan_hash)
        return JSONResponse(OperationList(tuple(found)).to_dict())

    async def operation(self, request: Request) -> Response:
        operation_id = request.path_params["operation_id"]
        found = await self._control(self.driver.operation, operation_id)
        if found is None:
            raise ApiError(f"no operation {operation_id}", status=404)
        return JSONResponse(found.to_dict())

    async def metrics(self, request: Request) -> Response:
        body = await self._control(generate_latest, self.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def healthz(self, request: Request) -> Response:
        # 503 while the driver reports itself unhealthy (e.g. caught in a recovery loop); a driver without
        # `health` (a test fake) has nothing to report beyond the service answering.
        health = getattr(self.driver, "health", None)
        if health is None:
            return JSONResponse({"ok": True})
        report = await self._control(health)
        return JSONResponse(report.to_dict(), status_code=200 if report.ok else 503)


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def _open(request: Request) -> None:
    """/healthz and /metrics: probes and scrapers hold no credentials, and neither answer carries a secret."""


def build_app(driver: Driver, credentials: Credentials, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
              jobs: JobLedger | None = None, allowed_hosts: AllowedHosts | None = None,
              witness: AuditWitness | None = None, chat_max_tokens: int | None = None) -> Starlette:
    """The ASGI app for `driver`; it never shuts the driver down (engine/serve/frontend.py does), so tests may share
    one. `jobs`: the spent-job ledger and `witness` the witnessed audit heads (default: each in memory, for an app
    built in-process); `allowed_hosts`: the Host names /v1 answers to (default: loopback's); `chat_max_tokens`: a
    chat's cap without max_tokens (default: $SEAM_CHAT_MAX_TOKENS, else 1024)."""
    service = _Service(driver, credentials, max_body_bytes, jobs if jobs is not None else JobLedger(),
                       allowed_hosts or AllowedHosts(), witness if witness is not None else AuditWitness(),
                       chat_max_tokens if chat_max_tokens is not None else read_chat_max_tokens())
    api, control = service.api_gate, service.control_gate
    routes = [
        ("/v1/completions", service.completions, "POST", api),
        ("/v1/chat/completions", service.chat, "POST", api),
        ("/v1/models", service.models, "GET", api),
        ("/v1/models/{model_id:path}", service.model, "GET", api),
        ("/control/state", service.state, "GET", control),
        ("/control/plan", service.plan, "POST", control),
        ("/control/apply", service.apply, "POST", control),
        ("/control/operations", service.find_operations, "GET", control),
        ("/control/audit-head", service.audit_head, "GET", control),
        ("/control/operations/{operation_id}", service.operation, "GET", control),
        ("/metrics", service.metrics, "GET", _open),
        ("/healthz", service.healthz, "GET", _open),
    ]
    return Starlette(routes=[Route(path, _guarded(handler, gate), methods=[method])
                             for path, handler, method, gate in routes],
                     exception_handlers={HTTPException: _http_error})
