"""Reading a request's JSON object within bounds: a size cap (413) and a nesting cap (400).

The size is checked on the declared Content-Length first and then counted while the body streams in, so a
client that lies about its length, or sends none (chunked), is cut off at the cap too. The nesting depth is
checked by a linear scan before json.loads ever runs: Python's parser recurses once per level, and a body
100k levels deep would otherwise end in a RecursionError (a 500) after tying up a thread.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import anyio
from anyio import to_thread
from starlette.requests import Request

from engine.errors import EngineError
from engine.openai_api import ApiError

__all__ = ["DEFAULT_MAX_BODY_BYTES", "MAX_BODY_ENV", "MAX_DEPTH", "max_body_bytes", "nesting_exceeds",
           "read_json_object"]

MAX_BODY_ENV = "SEAM_MAX_BODY_BYTES"
# A prompt of token ids at a long max_model_len (131072 ids of up to 7 characters each) is about 1 MiB; 8 MiB
# leaves room for long chat messages while keeping a body from filling memory.
DEFAULT_MAX_BODY_BYTES = 8 * 2**20
MAX_DEPTH = 64  # no request or plan nests deeper than a handful of levels
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included (no backtracking)
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_OPENING = frozenset(b"[{")


def max_body_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """The body cap from SEAM_MAX_BODY_BYTES (default 8 MiB); EngineError naming the variable when malformed."""
    text = environ.get(MAX_BODY_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BODY_BYTES
    if not text.isdigit() or int(text) < 1:
        raise EngineError(f"{MAX_BODY_ENV}={text!r}: expected a positive number of bytes "
                          f"(default {DEFAULT_MAX_BODY_BYTES})")
    return int(text)


def nesting_exceeds(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether arrays and objects in `raw` nest deeper than `limit`; brackets inside strings do not count."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    depth = 0
    for byte in brackets:
        if byte in _OPENING:
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


async def _read_capped(request: Request, limit: int) -> bytes:
    too_large = ApiError(f"the request body is larger than this engine accepts ({limit} bytes; the operator sets "
                         f"{MAX_BODY_ENV})", status=413)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise ApiError("the request body is empty: send a JSON object")
    if nesting_exceeds(raw):
        raise ApiError(f"the request body nests arrays and objects deeper than {MAX_DEPTH} levels")
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError alike
        raise ApiError(f"the request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def _no_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity, which no sampling parameter or plan may be.
    raise ValueError(f"{name} is not a JSON number")


async def read_json_object(request: Request, limit: int, limiter: anyio.CapacityLimiter | None = None) -> dict:
    """The body as a JSON object, or ApiError: 413 past `limit` bytes, 400 too deep, malformed or not an object.

    Scanning and parsing a body of megabytes takes a while, so it runs on a worker thread, not the event loop."""
    raw = await _read_capped(request, limit)
    return await to_thread.run_sync(_parse, raw, limiter=limiter)
