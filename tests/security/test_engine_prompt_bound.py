"""A text prompt too long to fit max_model_len is refused before it is tokenized (issue 30, item 6).

A 7.9 MB prompt used to reach the tokenizer, which took seconds (holding the GIL, so the whole engine froze) only for
the request to be refused for its length afterwards. The bound is Driver.max_prompt_chars (engine/runtime/text.py):
twice
max_model_len times the longest vocabulary entry. The app is `build_app`'s around the real driver, in-process, so
the test sees whether the checkpoint's real tokenizer was ever asked.
"""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from engine.serve.access import Credentials
from engine.serve.http import build_app
from tests.support.held_tokenizer import HeldTokenizer

SEVEN_POINT_NINE_MB = 7_900_000


@pytest.fixture
def tokenizer(engine_driver, monkeypatch):
    watched = HeldTokenizer(engine_driver.text.tokenizer, held=False)
    monkeypatch.setattr(engine_driver.text, "tokenizer", watched)
    return watched


@pytest.fixture(scope="module")
def client(engine_driver):
    with TestClient(build_app(engine_driver, Credentials()), base_url="http://localhost") as client:
        yield client


def _limit(engine_driver) -> int:
    return engine_driver.max_prompt_chars()


@pytest.mark.parametrize(("route", "field", "body"), [
    ("/v1/completions", "prompt", lambda text: {"prompt": text}),
    ("/v1/completions", "prompt", lambda text: {"prompt": [text]}),  # the one-prompt batch form
    ("/v1/chat/completions", "messages", lambda text: {"messages": [{"role": "user", "content": text}]}),
    ("/v1/chat/completions", "messages",
     lambda text: {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}),
], ids=["completion", "completion-batch", "chat", "chat-parts"])
def test_a_7_9_mb_prompt_is_400_naming_the_field_and_the_limit_before_tokenizing(client, tokenizer, engine_driver,
                                                                              route, field, body):
    """Pins the prompt bound (GenerationRequest.check_prompt_chars, issue 30 item 6): without it the text is
    tokenized (seconds) and then refused by the scheduler, naming no field."""
    text = "the pool binds " * (SEVEN_POINT_NINE_MB // 15)
    reply = client.post(route, json=body(text) | {"max_tokens": 1})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error"
    assert f"more than the {_limit(engine_driver):,}" in error["message"]
    assert f"max_model_len of {engine_driver.max_model_len:,} tokens" in error["message"]
    assert tokenizer.lengths == []  # refused before the tokenizer saw it
    served = client.post("/v1/completions", json={"prompt": "the pool binds", "max_tokens": 2, "temperature": 0})
    assert served.status_code == 200 and tokenizer.lengths == [len("the pool binds")]


def test_the_bound_is_twice_max_model_len_times_the_longest_token(engine_driver):
    """No text longer than the bound can fit: each token stands for at most its vocabulary entry's characters (the
    demo's longest, <|endoftext|>, has 13), doubled for a normalizer that folds characters."""
    vocab = engine_driver.text.tokenizer.get_vocab(with_added_tokens=True)
    assert _limit(engine_driver) == 2 * engine_driver.max_model_len * max(map(len, vocab)) == 2 * 2048 * 13


def test_a_prompt_within_the_bound_is_tokenized_and_judged_by_its_tokens(client, tokenizer, engine_driver):
    """Just under the bound the tokenizer decides: this text is too many tokens, refused as before (no field)."""
    text = "x" * _limit(engine_driver)
    reply = client.post("/v1/completions", json={"prompt": text, "max_tokens": 1})
    assert reply.status_code == 400 and "max_model_len is 2048" in reply.json()["error"]["message"], reply.text
    assert tokenizer.lengths == [len(text)]
