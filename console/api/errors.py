"""One DRF exception handler for the API: every refusal is JSON with a `detail` that names the problem.

Service errors (console.jobs.errors) answer their own status_code, with `field` / `reasons` when they have
them; DRF's own errors keep DRF's answer; solver errors (bad frontier parameters) are 400; anything else is
logged with its request id and answered as JSON, never as Django's HTML error page.
"""

from __future__ import annotations

import logging

from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from console.api.parsers import BoundedJSONParser
from console.api.schema import ConsoleAutoSchema
from console.audit.request_id import current_request_id
from console.jobs.errors import JobError
from contracts.errors import ContractError
from solvers.errors import SolverError

__all__ = ["ApiErrors", "exception_handler"]

log = logging.getLogger("seam.api")


def exception_handler(exc, context):
    if isinstance(exc, JobError):
        data = {"detail": str(exc), "code": type(exc).__name__}
        if getattr(exc, "field", None):
            data["field"] = exc.field
        if getattr(exc, "reasons", None):
            data["reasons"] = list(exc.reasons)
        return Response(data, status=exc.status_code)
    if isinstance(exc, ContractError | SolverError):  # bad input, named by a contract or by the planner
        code = "ContractError" if isinstance(exc, ContractError) else "SolverError"
        return Response({"detail": str(exc), "code": code}, status=status.HTTP_400_BAD_REQUEST)
    response = drf_exception_handler(exc, context)
    if response is not None:
        if isinstance(exc, ValidationError) and not (isinstance(response.data, dict) and "detail" in response.data):
            response.data = _one_detail(response.data)
        return response
    request_id = current_request_id()
    log.exception("unexpected error in the API (request %s)", request_id)
    return Response({"detail": f"internal error ({type(exc).__name__}); quote request id {request_id}",
                     "code": "InternalError", "request_id": request_id},
                    status=status.HTTP_500_INTERNAL_SERVER_ERROR)


def _one_detail(errors) -> dict:
    """DRF's per-field errors ({"plan_hash": ["Not a valid string."]}) as the API's one shape, first field named."""
    field, messages = next(iter(errors.items()), (None, [])) if isinstance(errors, dict) else (None, errors)
    message = messages[0] if isinstance(messages, list) and messages else messages
    while isinstance(message, dict):  # nested serializers: name the path
        key, inner = next(iter(message.items()))
        field, message = f"{field}.{key}", inner[0] if isinstance(inner, list) and inner else inner
    return {"detail": f"{field}: {message}" if field else str(message), "code": "ValidationError", "field": field,
            "errors": errors}


class ApiErrors:
    """Mixin for the API's views, whatever REST_FRAMEWORK says: this module's handler, the bounded JSON parser,
    and a schema that documents the refusals too."""

    parser_classes = [BoundedJSONParser, FormParser, MultiPartParser]
    schema = ConsoleAutoSchema()

    def get_exception_handler(self):
        return exception_handler
