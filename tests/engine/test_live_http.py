"""The real engine service over HTTP: the OpenAI endpoints, /metrics, refusals, concurrency, disconnects.

One service (three rank processes on CPU, the cpu-demo rig) is started for the whole module on a demo
checkpoint; every generation is greedy and compared with what the single-rank `engine.llm.LLM` produces
for the same prompt. Credentials (control token, attestation, API key) are tested in
tests/security/test_engine_credentials.py; this service holds the test session's control token.
"""

import json
import random
import socket
import time

import httpx
import pytest

from contracts.measurement import STEP_KINDS, LayoutMeasurement
from contracts.telemetry import USED_CATEGORIES
from engine.demo import make_demo_checkpoint
from engine.llm import LLM
from engine.runtime.sampler import SamplingParams
from engine.serve.openai_api import render_chat
from tests.support.live_service import LiveService, run_concurrently
from tests.support.metrics import Samples, scrape

MAX_MODEL_LEN = 2048  # the cpu-demo rig's shape
TEXT_PROMPT = "The operator asks which rank binds the pool"
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Which rank binds the pool?"}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("http") / "demo-checkpoint"
    make_demo_checkpoint(folder)
    return folder


@pytest.fixture(scope="module")
def llm(checkpoint):
    """The single-rank reference: the same checkpoint, one process, no HTTP."""
    return LLM(checkpoint)


@pytest.fixture(scope="module")
def service(checkpoint):
    # Not the run's shared engine, which the job tests move: these tests read the incumbent layout (cut 7,5,4) and
    # the model's name, and end by stopping it cleanly.
    live = LiveService(checkpoint)
    yield live
    assert live.stop() in (0, -15)


def _reference(llm, prompt, max_tokens, **params):
    return llm.generate([prompt], SamplingParams(max_tokens=max_tokens, **params))[0]


def _events(response: httpx.Response) -> list:
    """The `data:` payloads of a server-sent event stream, JSON-decoded, with the closing [DONE] kept as is."""
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line.removeprefix("data: ")
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def _metrics(service) -> Samples:
    return scrape(service.client)


def test_streamed_tokens_equal_the_whole_answer(service, llm):
    prompt = [5, 77, 300, 12, 901, 44, 6]
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0}
    whole = service.client.post("/v1/completions", json=body)
    assert whole.status_code == 200, whole.text
    choice = whole.json()["choices"][0]
    with service.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        events = _events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2 and all(chunk["object"] == "text_completion" for chunk in chunks)
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    streamed = [token for chunk in chunks for token in chunk["choices"][0]["token_ids"]]
    assert streamed == choice["token_ids"] == _reference(llm, prompt, 12).token_ids
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == choice["text"]


def test_a_streamed_usage_chunk_comes_last_when_asked(service):
    body = {"prompt": [9, 8, 7], "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with service.client.stream("POST", "/v1/completions", json=body) as response:
        events = _events(response)
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"] == []
    assert events[-2]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_a_text_prompt_returns_text(service, llm):
    reply = service.client.post("/v1/completions", json={"prompt": TEXT_PROMPT, "max_tokens": 10, "temperature": 0})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    expected = _reference(llm, TEXT_PROMPT, 10)
    choice = body["choices"][0]
    assert choice["token_ids"] == expected.token_ids
    assert isinstance(choice["text"], str) and choice["text"] == expected.text
    assert body["usage"]["prompt_tokens"] == len(llm.encode(TEXT_PROMPT))
    assert body["usage"]["completion_tokens"] == len(expected.token_ids)


def test_a_chat_completion(service, llm, checkpoint):
    reply = service.client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 8, "temperature": 0})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == checkpoint.name
    choice = body["choices"][0]
    expected = _reference(llm, render_chat(CHAT), 8)
    assert choice["message"] == {"role": "assistant", "content": expected.text}
    assert choice["token_ids"] == expected.token_ids
    assert body["usage"]["prompt_tokens"] == len(llm.encode(render_chat(CHAT)))


def test_a_streamed_chat_completion(service, llm):
    body = {"messages": CHAT, "max_tokens": 6, "temperature": 0, "stream": True}
    with service.client.stream("POST", "/v1/chat/completions", json=body) as response:
        events = _events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = [token for chunk in chunks for token in chunk["choices"][0]["token_ids"]]
    expected = _reference(llm, render_chat(CHAT), 6)
    assert streamed == expected.token_ids
    assert "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks) == expected.text


def test_models_lists_the_checkpoint(service, checkpoint):
    reply = service.client.get("/v1/models")
    assert reply.status_code == 200
    assert reply.json() == {"object": "list", "data": [{"id": checkpoint.name, "object": "model", "created": 0,
                                                        "owned_by": "seam", "max_model_len": MAX_MODEL_LEN}]}


def test_metrics_are_prometheus_text_for_three_ranks(service):
    samples = _metrics(service)
    state = service.state()
    for rank, row in enumerate(state["ranks"]):
        labels = {"rank": str(rank), "name": row["name"]}
        for category in USED_CATEGORIES:
            key = ("seam_rank_memory_bytes", tuple(sorted({**labels, "category": category}.items())))
            assert key in samples, f"no {category} bytes for rank {rank}"
        weights = samples[("seam_rank_memory_bytes", tuple(sorted({**labels, "category": "weights"}.items())))]
        kv_pool = samples[("seam_rank_memory_bytes", tuple(sorted({**labels, "category": "kv_pool"}.items())))]
        assert weights == row["measured"]["weights_bytes"] > 0
        assert kv_pool == row["measured"]["kv_pool_bytes"] > 0
        assert samples[("seam_kv_tokens_total", tuple(sorted(labels.items())))] == state["pool_tokens"]
    ranks = {dict(labels)["rank"] for name, labels in samples if name == "seam_rank_memory_bytes"}
    assert ranks == {"0", "1", "2"}
    assert samples[("seam_engine_pool_tokens", ())] == state["pool_tokens"] > 0
    assert ("seam_engine_info", (("cut", "7,5,4"), ("phase", "serving"))) in samples


def test_a_request_past_max_model_len_is_refused_and_serving_goes_on(service, llm):
    prompt = list(range(3, 103))
    reply = service.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": MAX_MODEL_LEN - 99})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "max_model_len" in error["message"] and str(MAX_MODEL_LEN) in error["message"]
    assert "2049" in error["message"]
    # Streaming is refused the same way, before any event is sent.
    streamed = service.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": MAX_MODEL_LEN,
                                                            "stream": True})
    assert streamed.status_code == 400 and "max_model_len" in streamed.json()["error"]["message"]
    assert service.complete(prompt, 5) == _reference(llm, prompt, 5).token_ids


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_malformed_json_is_refused(service, path):
    for raw in (b'{"prompt": [1, 2, 3], "max_tokens": 4,', b"", b"[1, 2, 3]", b'{"max_tokens": NaN}'):
        reply = service.client.post(path, content=raw, headers={"content-type": "application/json"})
        assert reply.status_code == 400, (raw, reply.text)
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
    health = service.client.get("/healthz")
    assert health.status_code == 200 and health.json()["ok"] is True


def test_malformed_json_on_the_control_api_is_refused(service):
    reply = service.client.post("/control/plan", content=b"{kind: cut}", headers={"content-type": "application/json"})
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]


def test_a_ladder_plan_without_an_armed_ladder_is_refused_when_planned(service):
    fingerprint = service.state()["fingerprint"]
    reply = service.client.post("/control/plan", json={"kind": "ladder", "target": {"rung": [8, 4, 4]},
                                                       "incumbent_fingerprint": fingerprint})
    assert reply.status_code == 422 and "no layout ladder is armed" in reply.json()["error"]


def test_twenty_concurrent_requests_all_complete_with_the_single_rank_tokens(service, llm):
    rng = random.Random(20)
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randrange(3, 48))] for _ in range(20)]
    expected = [c.token_ids for c in llm.generate(prompts, SamplingParams(max_tokens=12))]
    threads, results = run_concurrently(service, prompts, 12)
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert results == expected


def test_a_client_that_disconnects_mid_stream_does_not_wedge_the_engine(service, llm):
    prompt = [11, 22, 33, 44]
    body = {"prompt": prompt, "max_tokens": MAX_MODEL_LEN - len(prompt), "temperature": 0, "ignore_eos": True,
            "stream": True}
    own = httpx.Client(base_url=service.url, timeout=60)  # a connection of its own, closed below
    with own, own.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        received = 0
        for line in response.iter_lines():
            received += line.startswith("data: {")
            if received >= 3:
                break  # hang up with ~2000 tokens still to come
    # The abandoned request is cancelled, not decoded to its end (that would take far longer than this).
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        samples = _metrics(service)
        if samples[("seam_num_requests_running", ())] == 0 and samples[("seam_num_requests_waiting", ())] == 0:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the engine is still working on a request whose client went away")
    assert all(value == 0 for (name, _), value in samples.items() if name == "seam_kv_tokens_used")
    assert service.complete(prompt, 8) == _reference(llm, prompt, 8).token_ids


def _busy(service) -> bool:
    samples = _metrics(service)
    return samples[("seam_num_requests_running", ())] + samples[("seam_num_requests_waiting", ())] > 0


def _healthz_on(connection: socket.socket, host: str) -> bytes:
    """One GET /healthz on an open connection, kept alive; returns the status line (b"" if the server had closed it)."""
    connection.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = connection.recv(4096)
        if not chunk:
            return b""
        reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = int(next(line.split(b":")[1] for line in lines if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += connection.recv(4096)
    return lines[0]


def test_an_idle_connection_outlives_the_clients_keep_alive(service):
    # httpx (the console's client, the `openai` client's) drops an idle connection after 5 s. Were the server's timer
    # as short, a request sent as it fires meets a closed socket ("Server disconnected without sending a response"),
    # which once failed a console test in CI; the server must be the one that waits longer.
    host = service.url.removeprefix("http://")
    with socket.create_connection(("127.0.0.1", service.port), timeout=30) as connection:
        assert _healthz_on(connection, host) == b"HTTP/1.1 200 OK"
        time.sleep(httpx.Limits().keepalive_expiry + 1.5)
        assert _healthz_on(connection, host) == b"HTTP/1.1 200 OK"


def test_a_non_streaming_client_that_disconnects_is_cancelled(service):
    body = {"prompt": [7, 8, 9], "max_tokens": MAX_MODEL_LEN - 3, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{service.url}/v1/completions", json=body, timeout=1.0)
    deadline = time.monotonic() + 3
    while _busy(service) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _busy(service), "the engine is still decoding for a client that went away"


def test_the_state_reports_each_ranks_stage_time(service):
    """What the timing model is calibrated from: every rank's own stage, per kind of step, from the real ranks."""
    reply = service.client.post("/v1/completions", json={"prompt": list(range(3, 40)), "max_tokens": 12,
                                                         "temperature": 0, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    state = service.state()
    assert "stage_ms" not in state  # the measurement carries the stage times now
    measurement = LayoutMeasurement.from_dict(state["measurement"])
    for kind in STEP_KINDS:
        stats = measurement.stats(kind)
        assert stats.steps >= 1 and len(stats.median_ms) == len(stats.spread_ms) == 3
        assert all(ms > 0 for ms in stats.median_ms) and all(sd >= 0 for sd in stats.spread_ms)
    assert measurement.decode.steps >= 11  # every decode step of the request, each timed on every rank
    samples = _metrics(service)
    for rank, row in enumerate(state["ranks"]):
        labels = tuple(sorted({"rank": str(rank), "name": row["name"], "kind": "decode"}.items()))
        assert samples[("seam_engine_stage_ms", labels)] > 0
    assert samples[("seam_engine_latency_requests", ())] >= 1 and samples[("seam_engine_ttft_ms", ())] > 0
