"""Tokenizing never stops the engine answering (issue 30, item 6): /healthz and /control/state answer while a
prompt is being tokenized, and the tokenizer lets other threads run while it works.

A 7.9 MB prompt froze /healthz, /control/state and every stream for 7 s: the tokenizer ran on a worker thread, but
`Tokenizer.encode` holds the GIL throughout, and chat templating ran on the event loop. Now the whole of it runs on a
worker thread (engine/serve/http.py, _Service._tokenized) through `encode_batch`, which releases the GIL.

The first test holds the checkpoint's real tokenizer (tests/security/held_tokenizer.py) until /healthz and
/control/state have answered, so it needs no timing: were the work on the event loop, neither could answer until
the hold ran out, and the test would see that.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from starlette.testclient import TestClient

from contracts.attestation import bearer_token
from engine.runtime.text import CheckpointText
from engine.serve.access import Credentials
from engine.serve.http import build_app
from tests.support.held_tokenizer import HeldTokenizer

CREDENTIALS = Credentials(control_token="control-token-for-tests")
TEXT = "Which rank binds the pool, and how many tokens does it hold? "  # about 1000 tokens, times 60


@pytest.fixture
def held(engine_driver, monkeypatch):
    tokenizer = HeldTokenizer(engine_driver.text.tokenizer, held=True)
    monkeypatch.setattr(engine_driver.text, "tokenizer", tokenizer)
    yield tokenizer
    tokenizer.release.set()  # never leave a caller waiting on a failed test


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/completions", {"prompt": TEXT * 60}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": TEXT * 60}]}),
], ids=["completion", "chat"])
def test_healthz_and_control_state_answer_while_a_prompt_is_tokenized(engine_driver, held, route, body):
    """Pins _Service._tokenized running on a worker thread (issue 30, item 6): on the event loop, /healthz could not
    answer while the tokenizer is held."""
    app = build_app(engine_driver, CREDENTIALS)
    # Inside `with`, every request goes through one event loop, as under uvicorn.
    with TestClient(app, base_url="http://localhost", headers=bearer_token(CREDENTIALS.control_token)) as client, \
            ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.post, route, json=body | {"max_tokens": 2, "temperature": 0})
        assert held.entered.wait(120), "the prompt never reached the tokenizer"
        health = client.get("/healthz")
        state = client.get("/control/state")
        held.release.set()
        reply = pending.result(timeout=300)
    assert held.released_in_time, "the tokenizer's hold ran out: /healthz waited for it"
    assert health.status_code == 200 and health.json()["ok"] is True, health.text
    assert state.status_code == 200 and state.json()["phase"] == "serving", state.text
    assert reply.status_code == 200 and len(reply.json()["choices"][0]["token_ids"]) == 2, reply.text
    assert held.lengths and held.lengths[0] >= len(TEXT) * 60


@pytest.mark.slow
def test_the_tokenizer_lets_other_threads_run_while_it_encodes(demo_checkpoint):
    """Pins CheckpointText.encode's GIL release (encode_batch; issue 30, item 6): with `Tokenizer.encode`, which holds
    the GIL, this thread could not take a single step while a long text is encoded (seconds), as the event loop could
    not (a few steps at most, before the encoding starts). Released, it takes hundreds to thousands."""
    text = CheckpointText(demo_checkpoint, 1024)
    long_text = TEXT * 40_000  # 2.4 MB: a second or more of tokenizing
    started, done = threading.Event(), threading.Event()

    def encode() -> None:
        started.set()
        text.encode(long_text)
        done.set()

    worker = threading.Thread(target=encode)
    worker.start()
    started.wait()
    steps = 0
    while not done.wait(0.001):
        steps += 1
    worker.join()
    assert steps >= 100, f"this thread ran {steps} steps while the tokenizer worked"
