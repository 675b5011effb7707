"""A lone UTF-16 surrogate anywhere in a body is a 400 naming where it is, never a 500 (issue 30, item 8), against
the real engine service.

JSON's escapes can spell "\\ud800" alone, and Python's parser hands it on as a string that is not text: the
tokenizer refused it (500), and a reply echoing it could not be encoded (500, not even JSON). engine/serve/json_body.py
refuses it while reading the body, on every route.
"""

from __future__ import annotations

import pytest

CASES = [  # (route, raw body, the param the refusal names)
    ("/v1/completions", rb'{"prompt": "a\ud800b", "max_tokens": 2}', "prompt"),
    ("/v1/completions", rb'{"prompt": ["\udfff"], "max_tokens": 2}', "prompt[0]"),
    ("/v1/completions", b'{"prompt": "a\xed\xa0\x80b", "max_tokens": 2}', "prompt"),  # raw UTF-8 of U+D800
    ("/v1/completions", rb'{"prompt": "ok", "user": "\ud800"}', "user"),
    ("/v1/completions", rb'{"prompt": "ok", "model": "\ud800"}', "model"),
    ("/v1/completions", rb'{"\ud800": 1, "prompt": "ok"}', "'\\ud800'"),
    ("/v1/chat/completions", rb'{"messages": [{"role": "user", "content": "\udbff"}]}', "messages[0].content"),
    ("/v1/chat/completions", rb'{"messages": [{"role": "user", "content": "hi"}, '
                             rb'{"role": "user", "content": [{"type": "text", "text": "x\ud800"}]}]}',
     "messages[1].content[0].text"),
    ("/v1/chat/completions", rb'{"messages": [{"role": "user", "content": "hi", "name": "\ud800"}]}',
     "messages[0].name"),
    ("/control/plan", rb'{"kind": "cut", "target": {"cut": "\ud800"}, "incumbent_fingerprint": "x"}',
     "target.cut"),
]


@pytest.mark.parametrize(("route", "raw", "param"), CASES, ids=[param for _, _, param in CASES])
def test_a_lone_surrogate_is_400_naming_where_it_is(engine, route, raw, param):
    """Pins json_body._refuse_surrogates (issue 30, item 8): without it the prompts and chat contents are 500s
    (TypeError in the tokenizer) and the key a bare-text 500 (the error echoing it cannot be encoded); the fields
    the engine ignores (user, name) are served."""
    reply = engine.client.post(route, content=raw, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    message = error["message"] if isinstance(error, dict) else error
    assert "lone UTF-16 surrogate" in message and param in message
    if route.startswith("/v1/"):
        assert error["param"] == param
    assert len(engine.complete([5, 6, 7], 2)) == 2


def test_a_surrogate_pair_is_one_character_and_served(engine):
    reply = engine.client.post("/v1/completions", content=rb'{"prompt": "a\ud83d\ude00b", "max_tokens": 2}',
                               headers={"content-type": "application/json"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] >= 3
