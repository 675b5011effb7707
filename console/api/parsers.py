"""The API's JSON parser: bounded in size and nesting, so a hostile body is a 4xx and never a 500.

DRF's own JSONParser reads the whole stream (Django's DATA_UPLOAD_MAX_MEMORY_SIZE only guards
`request.body`) and lets a deeply nested document end in a RecursionError. This one reads at most
MAX_BODY_BYTES, refuses more with 413, and refuses with 400 nesting deeper than MAX_DEPTH, NaN, and numbers
past a float's range (1e999). Refusals carry the sha256 of the bytes read, for the audit event of a refused
proposal.
"""

from __future__ import annotations

import hashlib
import json
import math

from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser

__all__ = ["MAX_BODY_BYTES", "MAX_DEPTH", "BodyTooLarge", "BoundedJSONParser"]

MAX_BODY_BYTES = 64 * 1024  # a plan body is a few hundred bytes
MAX_DEPTH = 16


class BodyTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "body_too_large"


def _depth(document: object) -> int:
    deepest, stack = 0, [(document, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _refused(error: APIException, raw: bytes) -> APIException:
    error.body_sha256 = hashlib.sha256(raw).hexdigest()
    return error


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read(MAX_BODY_BYTES + 1) if stream is not None else b""
        if len(raw) > MAX_BODY_BYTES:
            raise _refused(BodyTooLarge(f"body: larger than {MAX_BODY_BYTES} bytes"), raw)
        try:
            document = json.loads(raw.decode("utf-8"), parse_constant=self._refuse_constant,
                                  parse_float=self._finite_float)
        except RecursionError:
            raise _refused(ParseError(f"body: JSON nested deeper than {MAX_DEPTH} levels"), raw) from None
        except (ValueError, UnicodeDecodeError) as error:
            raise _refused(ParseError(f"body: not valid JSON ({error})"), raw) from None
        if _depth(document) > MAX_DEPTH:
            raise _refused(ParseError(f"body: JSON nested deeper than {MAX_DEPTH} levels"), raw)
        return document

    @staticmethod
    def _refuse_constant(name: str):
        raise ValueError(f"{name} is not a JSON number")

    @staticmethod
    def _finite_float(text: str) -> float:
        number = float(text)
        if not math.isfinite(number):  # 1e999 parses as infinity, which no JSON writer can send on
            raise ValueError(f"{text[:40]} is out of range for a number")
        return number
