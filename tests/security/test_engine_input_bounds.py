"""Bounds on every JSON body the engine reads (issue 13, item 6), against the real service: a body nested
100k levels deep is a 400 (it used to end in a RecursionError, a 500), a 50 MB body is a 413 whether it declares
its length or streams it chunked, and the engine serves on afterwards.

They use the session's shared test engine: nothing here changes its layout.
"""

from __future__ import annotations

import pytest

from engine.errors import EngineError
from engine.serve.json_body import DEFAULT_MAX_BODY_BYTES, MAX_BODY_ENV, MAX_DEPTH, max_body_bytes, nesting_exceeds

FIFTY_MB = 50 * 2**20
ROUTES = ["/v1/completions", "/v1/chat/completions", "/control/plan", "/control/apply"]


def _still_serving(engine) -> None:
    assert engine.client.get("/healthz").status_code == 200
    assert len(engine.complete([5, 6, 7], 2)) == 2


def _message(reply) -> str:
    error = reply.json()["error"]
    return error["message"] if isinstance(error, dict) else error


@pytest.mark.parametrize("route", ROUTES)
def test_a_body_nested_100k_deep_is_400_naming_the_limit(engine, route):
    deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    reply = engine.client.post(route, content=deep, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert f"deeper than {MAX_DEPTH}" in _message(reply)
    _still_serving(engine)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("route", ["/v1/completions", "/control/plan"])
def test_a_50_mb_body_is_413_and_the_engine_serves_on(engine, route, chunked):
    body = b'{"prompt": [' + b"1," * (FIFTY_MB // 2) + b'1]}'  # uncapped, all 50 MB would be parsed
    content = (body[i:i + 2**20] for i in range(0, len(body), 2**20)) if chunked else body
    reply = engine.client.post(route, content=content, headers={"content-type": "application/json"})
    assert reply.status_code == 413, reply.text
    assert MAX_BODY_ENV in _message(reply)
    _still_serving(engine)


def test_a_long_token_id_prompt_fits_under_the_default_cap(engine):
    """131072 token ids of 6 digits (a long max_model_len) are about 1 MiB: refused for what they say (this
    engine's max_model_len is smaller), not for their size."""
    reply = engine.client.post("/v1/completions", json={"prompt": [999999] * 131072, "max_tokens": 1})
    assert reply.status_code == 400 and MAX_BODY_ENV not in _message(reply), reply.text


def test_brackets_inside_strings_do_not_count_as_nesting():
    assert not nesting_exceeds(b'{"prompt": "' + b"[{" * 1000 + b'\\"[[[", "x": [[1]]}')
    assert nesting_exceeds(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    assert not nesting_exceeds(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)


def test_the_cap_is_set_by_the_environment():
    assert max_body_bytes({}) == DEFAULT_MAX_BODY_BYTES
    assert max_body_bytes({MAX_BODY_ENV: "1024"}) == 1024
    for bad in ("0", "-5", "8MiB"):
        with pytest.raises(EngineError, match=MAX_BODY_ENV):
            max_body_bytes({MAX_BODY_ENV: bad})
