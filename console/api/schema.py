"""The API's OpenAPI generation: every operation also documents the refusals it can answer, with one body.

drf-spectacular documents the success response; clients (and schemathesis) also need the 4xx/5xx answers the
API really gives: 400 everywhere (a query or body it cannot take), 401/403 wherever a login is needed, 413/415
for any POST body (console.api.parsers), 404 on one job and 409 for the verbs on it. An operation adds its
own with extend_schema (e.g. 422 and 503 on propose); each refusal's body is ErrorSerializer.
"""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from rest_framework.permissions import AllowAny

from console.api.serializers import ErrorSerializer

__all__ = ["ConsoleAutoSchema"]


class ConsoleAutoSchema(AutoSchema):
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        for code in sorted(self._error_codes()):
            responses.setdefault(str(code), self._get_response_for_code(ErrorSerializer, str(code)))
        return responses

    def _error_codes(self) -> set[int]:
        codes = {400}  # a query or body it cannot take
        if not all(permission is AllowAny for permission in self.view.permission_classes):
            codes |= {401, 403}
        one_job = "{id}" in self.path
        if self.method == "POST":
            codes |= {400, 413, 415} | ({404, 409} if one_job else set())
        elif one_job:
            codes.add(404)
        return codes
