"""Reading a request's JSON object within bounds: a size cap (413), a nesting cap (400), and text only (400).

The size is checked on the declared Content-Length first and then counted while the body streams in, so a
client that lies about its length, or sends none (chunked), is cut off at the cap too. The nesting depth is
checked by a linear scan before json.loads ever runs: Python's parser recurses once per level, and a body
100k levels deep would otherwise end in a RecursionError (a 500) after tying up a thread. A string holding a lone
UTF-16 surrogate ("\\ud800", which JSON's escapes allow) is refused naming where it is: it is not text, so the
tokenizer refuses it and no reply that echoes it can be encoded (both were 500s).
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
from engine.serve.openai_api import ApiError

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
# Where a surrogate can come from: a \\uD800-\\uDFFF escape, or its raw UTF-8 form (json.loads decodes bytes with
# surrogatepass). A body with neither, nearly every body, is not walked.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # a pair decodes to one character, so any left is alone


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
    if _MAYBE_SURROGATE.search(raw):
        _refuse_surrogates(body, "")
    return body


def _refuse_surrogates(value: Any, path: str) -> None:
    """ApiError naming the first string (or key) under `value` that holds a lone surrogate; `path` is where it is."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        if found:
            raise ApiError(f"{path} holds a lone UTF-16 surrogate ({ascii(found.group())[1:-1]}), which is not text: "
                           "send valid Unicode (a character beyond U+FFFF as its surrogate pair)", path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_surrogates(item, f"{path}[{index}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            if _SURROGATE.search(key):  # named escaped: the key itself cannot be written back
                where = f"{path}.{ascii(key)}" if path else ascii(key)
                raise ApiError(f"the key {where} holds a lone UTF-16 surrogate, which is not text: send valid Unicode",
                               where)
            _refuse_surrogates(item, f"{path}.{key}" if path else key)


def _no_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity, which no sampling parameter or plan may be.
    raise ValueError(f"{name} is not a JSON number")


async def read_json_object(request: Request, limit: int, limiter: anyio.CapacityLimiter | None = None) -> dict:
    """The body as a JSON object, or ApiError: 413 past `limit` bytes, 400 too deep, malformed or not an object.

    Scanning and parsing a body of megabytes takes a while, so it runs on a worker thread, not the event loop."""
    raw = await _read_capped(request, limit)
    return await to_thread.run_sync(_parse, raw, limiter=limiter)
