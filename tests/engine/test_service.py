"""The HTTP layer alone, against a fake driver: shapes, streaming, validation, error mapping.

The real driver's behaviour is tested elsewhere; here `FakeDriver` answers deterministically (each output
token is the prompt's token shifted by one, cycling, until max_tokens) over a byte-level vocabulary, so text
and token ids are easy to predict and a multi-byte character can be split across tokens.

The app holds a control token and approval key, and `client` sends the token; the refusals without them are
tested against the real service in tests/security.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import threading
import time

import pytest
from starlette.testclient import TestClient

from contracts.attestation import bearer_token, sign_attestation
from contracts.control import EngineState, Health, LadderState, LayoutFigures, Operation, OperationStatus
from contracts.layout import Cut, ServingShape
from contracts.plan import Plan, PlanReply
from contracts.telemetry import EngineSnapshot, Snapshot
from engine.control.protocol import ApplyRefused, RequestHandle
from engine.errors import EngineError, EngineRequestError
from engine.runtime.sampler import SamplingParams
from engine.serve.access import Credentials
from engine.serve.http import build_app
from engine.serve.openai_api import IncrementalText
from solvers.errors import SolverError
from tests.support.live_service import lone_head
from tests.support.metrics import scrape

SNAPSHOT = Snapshot(seq=7, ts=1.0, ranks=(), engine=EngineSnapshot(
    cut=Cut((2, 2)), shape={}, phase="serving", running=0, waiting=0, prefill_tok_s=0.0, decode_tok_s=0.0,
    reconfiguring=False))
CREDENTIALS = Credentials(control_token="test-control-token", approval_key="test-approval-key")
JOB_IDS = itertools.count(1)


def _hash(plan: dict) -> str:
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


class FakeDriver:
    model_name = "fake-model"
    max_model_len = 64

    def __init__(self, tokenizer: bool = True, delay: float = 0.0):
        self.tokenizer = tokenizer
        self.delay = delay  # seconds per token: > 0 makes the service wait on an empty queue
        self.submitted: list[tuple[list[int], SamplingParams]] = []
        self.operations_by_id: dict[str, Operation] = {}

    def submit(self, prompt: list[int] | str, params: SamplingParams) -> RequestHandle:
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if any(t >= 256 for t in ids):
            raise EngineRequestError("token id out of the vocabulary (256)")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise EngineRequestError(f"prompt + max_tokens exceeds max_model_len {self.max_model_len}")
        self.submitted.append((ids, params))
        handle = RequestHandle(request_id=len(self.submitted), prompt_ids=ids)
        threading.Thread(target=self._generate, args=(handle, params.max_tokens), daemon=True).start()
        return handle

    def _generate(self, handle: RequestHandle, max_tokens: int) -> None:
        for i in range(max_tokens):
            time.sleep(self.delay)
            handle.emit((handle.prompt_ids[i % len(handle.prompt_ids)] + 1) % 256)
        handle.end("length")

    def encode(self, text: str) -> list[int]:
        if not self.tokenizer:
            raise EngineError("checkpoint has no tokenizer.json: pass token ids instead of text")
        return list(text.encode())

    def decode(self, token_ids: list[int]) -> str:
        return bytes(token_ids).decode(errors="replace")

    def max_prompt_chars(self) -> int | None:
        return self.max_model_len if self.tokenizer else None  # a token per byte: no more characters than tokens

    def state(self) -> EngineState:
        return EngineState(fingerprint="fp-1", cut=Cut((2, 2)), shape=ServingShape(), phase="serving",
                           ladder=LadderState(armed=False))

    def plan(self, body: dict) -> PlanReply:
        if body.get("kind") not in ("cut", "shape", "ladder"):
            raise SolverError("kind must be cut, shape or ladder")
        plan = body | {"predicted": {"pool_tokens": 1024}}
        return PlanReply(Plan.from_dict(plan), _hash(plan), body.get("target") != {"cut": [4, 0]}, ())

    def apply(self, plan: dict, plan_hash: str, job_id: int | None = None) -> str:
        if plan_hash != _hash(plan):
            raise ApplyRefused(400, "plan_hash does not match the plan")
        if plan.get("incumbent_fingerprint") != "fp-1":
            raise ApplyRefused(409, "the plan's incumbent fingerprint is not the current layout")
        if plan.get("target") == {"cut": [4, 0]}:
            raise ApplyRefused(422, "infeasible: rank 1 holds no layers")
        operation_id = f"op-{len(self.operations_by_id) + 1}"
        self.operations_by_id[operation_id] = Operation(
            id=operation_id, status=OperationStatus.RUNNING, phase="pausing", progress=0.1,
            predicted=LayoutFigures(plan["predicted"]["pool_tokens"], None, ()), measured=None, error=None,
            plan_hash=plan_hash, job_id=job_id)
        return operation_id

    def find_operations(self, plan_hash: str) -> list[Operation]:
        return [op for op in self.operations_by_id.values() if op.plan_hash == plan_hash.lower()]

    def operation(self, operation_id: str) -> Operation | None:
        return self.operations_by_id.get(operation_id)

    def operations(self) -> list[Operation]:
        return list(self.operations_by_id.values())

    def snapshot(self) -> Snapshot:
        return SNAPSHOT

    def shutdown(self) -> None:
        pass


@pytest.fixture
def driver() -> FakeDriver:
    return FakeDriver()


def _client(driver: FakeDriver) -> TestClient:
    # /v1 answers loopback's Host names only (engine/serve/cross_site.py), not TestClient's default "testserver".
    return TestClient(build_app(driver, CREDENTIALS), base_url="http://localhost",
                      headers=bearer_token(CREDENTIALS.control_token))


@pytest.fixture
def client(driver: FakeDriver) -> TestClient:
    return _client(driver)


def attested(plan_hash: str) -> dict:
    return sign_attestation(CREDENTIALS.approval_key, plan_hash, next(JOB_IDS), ["reviewer"], time.time(),
                            lone_head())


def post(client: TestClient, url: str, body, expect: int = 200) -> dict:
    response = client.post(url, json=body) if not isinstance(body, str | bytes) else client.post(
        url, content=body, headers={"content-type": "application/json"})
    assert response.status_code == expect, response.text
    return response.json()


def events(client: TestClient, url: str, body: dict) -> list:
    """The stream's data payloads, in order; the last must be [DONE]."""
    response = client.post(url, json=body | {"stream": True})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in response.text.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks)
    payloads = [b.removeprefix("data: ") for b in blocks]
    assert payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


def test_a_text_prompt_completes_in_openais_shape(client):
    out = post(client, "/v1/completions", {"model": "fake-model", "prompt": "abc", "max_tokens": 4})
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-") and out["model"] == "fake-model"
    assert isinstance(out["created"], int)
    assert out["choices"] == [{"index": 0, "text": "bcdb", "token_ids": [98, 99, 100, 98], "finish_reason": "length"}]
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_max_tokens_defaults_to_16_and_temperature_to_1(client, driver):
    post(client, "/v1/completions", {"prompt": "abc"})
    assert driver.submitted[-1][1].max_tokens == 16 and driver.submitted[-1][1].temperature == 1.0


def test_sampling_fields_reach_the_driver(client, driver):
    post(client, "/v1/completions", {"prompt": [1], "temperature": 0, "top_p": 0.5, "top_k": 3, "seed": 9,
                                     "stop_token_ids": [7], "ignore_eos": True, "stop": None, "n": 1})
    assert driver.submitted[-1][1] == SamplingParams(max_tokens=16, temperature=0.0, top_p=0.5, top_k=3, seed=9,
                                                     stop_token_ids=(7,), ignore_eos=True)


@pytest.mark.parametrize("prompt", [[97, 98, 99], [[97, 98, 99]], ["abc"]])
def test_token_id_prompts_and_one_prompt_batches_complete_alike(client, prompt):
    out = post(client, "/v1/completions", {"prompt": prompt, "max_tokens": 3})
    assert out["choices"][0]["token_ids"] == [98, 99, 100]


def test_a_streamed_completion_joins_to_the_whole_text(client):
    body = {"prompt": "hello", "max_tokens": 12}
    whole = post(client, "/v1/completions", body)["choices"][0]
    chunks = events(client, "/v1/completions", body)
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == whole["token_ids"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_a_stream_never_splits_a_character(driver, client):
    driver.delay = 0.005  # tokens arrive one by one: the first byte of each "é" comes alone
    chunks = events(client, "/v1/completions", {"prompt": [0xC2, 0xA8], "max_tokens": 4})
    texts = [c["choices"][0]["text"] for c in chunks]
    assert "".join(texts) == "éé" and not any("\ufffd" in t for t in texts)


def test_incremental_text_holds_back_half_a_character():
    text = IncrementalText(lambda ids: bytes(ids).decode(errors="replace"))
    pieces = [text.push([t]) for t in "aé€b".encode()] + [text.flush()]
    assert pieces == ["a", "", "é", "", "", "€", "b", ""]
    cut = IncrementalText(lambda ids: bytes(ids).decode(errors="replace"))
    assert cut.push([0xE2, 0x82]) == "" and cut.flush() == "\ufffd"  # ended mid-character: said, not lost


def test_stream_options_include_usage_adds_a_last_usage_chunk(client):
    chunks = events(client, "/v1/completions", {"prompt": "ab", "max_tokens": 3,
                                                "stream_options": {"include_usage": True}})
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_a_chat_renders_the_documented_template(client, driver):
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    out = post(client, "/v1/chat/completions", {"model": "fake-model", "messages": messages, "max_tokens": 2})
    prompt = "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    assert driver.submitted[-1][0] == list(prompt.encode())
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    content = driver.decode(out["choices"][0]["token_ids"])
    assert out["choices"][0]["message"] == {"role": "assistant", "content": content}
    assert out["choices"][0]["finish_reason"] == "length" and out["usage"]["prompt_tokens"] == len(prompt)


def test_a_chat_without_max_tokens_may_fill_the_context(client, driver):
    post(client, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    prompt_ids, params = driver.submitted[-1]
    assert len(prompt_ids) + params.max_tokens == driver.max_model_len


def test_a_streamed_chat_sends_the_role_then_content_deltas(client):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    whole = post(client, "/v1/chat/completions", body)["choices"][0]["message"]["content"]
    chunks = events(client, "/v1/chat/completions", body)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_text_without_a_tokenizer_is_refused_with_400():
    client = _client(FakeDriver(tokenizer=False))
    out = post(client, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, expect=400)
    assert "tokenizer" in out["error"]["message"] and out["error"]["param"] == "messages"
    assert post(client, "/v1/completions", {"prompt": "hi"}, expect=400)["error"]["param"] == "prompt"
    post(client, "/v1/completions", {"prompt": [1, 2]})


def test_models_lists_the_served_model(client):
    out = client.get("/v1/models").json()
    assert out["object"] == "list"
    assert out["data"][0] | {"created": 0} == {"id": "fake-model", "object": "model", "created": 0,
                                                "owned_by": "seam", "max_model_len": 64}


BAD_FIELDS = [
    ("max_tokens", "5"), ("max_tokens", -1), ("max_tokens", 0), ("max_tokens", True), ("max_tokens", 1.5),
    ("temperature", "hot"), ("temperature", -0.5), ("temperature", True), ("top_p", 0), ("top_p", 1.5),
    ("top_k", -1), ("top_k", 2.5), ("seed", "x"), ("seed", -3), ("n", 0), ("n", 129), ("n", "1"),
    ("stop", ["a", "b", "c", "d", "e"]), ("stop", [""]), ("stop", 5), ("stream", "yes"), ("stop_token_ids", ["a"]),
    ("stop_token_ids", 5), ("logprobs", 6), ("logprobs", True), ("echo", True), ("presence_penalty", 2.5),
    ("frequency_penalty", -3), ("repetition_penalty", 0), ("repetition_penalty", 2.5), ("model", 42), ("prompt", 5),
    ("prompt", []), ("prompt", ""), ("prompt", [1, -2]), ("prompt", [1, True]), ("prompt", ["a", "b"]),
    ("prompt", [[1], [2]]), ("ignore_eos", 1), ("stream_options", {"include_usage": True}), ("frobnicate", 1),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS)
def test_a_bad_field_is_refused_with_400_naming_it(client, driver, field, value):
    out = post(client, "/v1/completions", {"prompt": "abc", field: value}, expect=400)
    assert out["error"]["type"] == "invalid_request_error" and out["error"]["param"] == field
    assert field in out["error"]["message"] and driver.submitted == []


@pytest.mark.parametrize(("messages", "param"), [
    ([], "messages"), ("hi", "messages"), ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
    ([{"role": "user", "content": 3}], "messages[0].content"),
    ([{"role": "user", "content": "hi", "tool_calls": []}], "messages[0].tool_calls"),
])
def test_bad_messages_are_refused_with_400_naming_the_message(client, messages, param):
    assert post(client, "/v1/chat/completions", {"messages": messages}, 400)["error"]["param"] == param


def test_an_unknown_model_is_404(client):
    out = post(client, "/v1/completions", {"model": "gpt-4", "prompt": "a"}, expect=404)
    assert out["error"]["param"] == "model" and out["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'{"prompt": "a", "temperature": NaN}', b"\xff\xfe{"])
def test_a_body_that_is_not_a_json_object_is_400(client, raw):
    assert "request body" in post(client, "/v1/completions", raw, expect=400)["error"]["message"]
    assert isinstance(post(client, "/control/plan", raw, expect=400)["error"], str)


def test_a_request_the_driver_refuses_is_400_with_its_message(client):
    out = post(client, "/v1/completions", {"prompt": "abc", "max_tokens": 62}, expect=400)
    assert "max_model_len" in out["error"]["message"] and out["error"]["type"] == "invalid_request_error"
    assert "vocabulary" in post(client, "/v1/completions", {"prompt": [300]}, expect=400)["error"]["message"]


class RefusingDriver(FakeDriver):
    """Admits, then refuses mid-flight (as a driver does with a request that can no longer fit)."""

    def _generate(self, handle: RequestHandle, max_tokens: int) -> None:
        handle.emit(1)
        handle.end("refused", "preempted and can no longer fit")


def test_a_refusal_after_admission_is_400_or_an_error_event():
    client = _client(RefusingDriver())
    assert "no longer fit" in post(client, "/v1/completions", {"prompt": "a"}, expect=400)["error"]["message"]
    chunks = events(client, "/v1/completions", {"prompt": "a"})
    assert "no longer fit" in chunks[-1]["error"]["message"]


def test_control_state_plan_apply_and_operation(client, driver):
    assert client.get("/control/state").json()["fingerprint"] == "fp-1"
    planned = post(client, "/control/plan", {"kind": "cut", "target": {"cut": [3, 1]}, "incumbent_fingerprint": "fp-1"})
    assert planned["feasible"] and planned["plan"]["predicted"] == {"pool_tokens": 1024}
    attestation = attested(planned["plan_hash"])
    response = client.post("/control/apply", json={"plan": planned["plan"], "plan_hash": planned["plan_hash"],
                                                   "attestation": attestation})
    assert response.status_code == 202 and response.json() == {"operation_id": "op-1"}
    assert response.headers["location"] == "/control/operations/op-1"
    assert client.get("/control/operations/op-1").json()["status"] == "running"
    assert driver.operations_by_id["op-1"].job_id == attestation["job_id"]  # the attested job, not the body's


def test_a_malformed_plan_is_400(client):
    out = post(client, "/control/plan", {"kind": "teleport"}, expect=400)
    assert out == {"error": "kind must be cut, shape or ladder"}


@pytest.mark.parametrize(("body", "word"), [
    ({"plan_hash": "x"}, "plan"), ({"plan": {"kind": "cut"}}, "plan_hash"), ({"plan": [], "plan_hash": "x"}, "plan"),
    ({"plan": {}, "plan_hash": 5}, "plan_hash"), ({"plan": {}, "plan_hash": "x", "force": True}, "force"),
])
def test_apply_without_its_fields_is_400_naming_the_field(client, body, word):
    assert word in post(client, "/control/apply", body, expect=400)["error"]


@pytest.mark.parametrize(("target", "fingerprint", "tamper", "status", "message"), [
    ({"cut": [3, 1]}, "fp-1", True, 400, "plan_hash does not match the plan"),
    ({"cut": [3, 1]}, "fp-0", False, 409, "the plan's incumbent fingerprint is not the current layout"),
    ({"cut": [4, 0]}, "fp-1", False, 422, "infeasible: rank 1 holds no layers"),
])
def test_a_refused_apply_answers_the_drivers_status_and_message(client, driver, target, fingerprint, tamper, status,
                                                                 message):
    """The service forwards the driver's refusal as it is, status and message, and starts nothing. Which refusal the
    real engine gives for a tampered, stale or infeasible plan: tests/engine/test_apply_refusals.py."""
    planned = post(client, "/control/plan", {"kind": "cut", "target": target, "incumbent_fingerprint": fingerprint})
    plan_hash = "0" * 64 if tamper else planned["plan_hash"]
    body = {"plan": planned["plan"], "plan_hash": plan_hash, "attestation": attested(plan_hash)}
    assert post(client, "/control/apply", body, expect=status) == {"error": message}
    assert driver.operations_by_id == {}


def test_apply_on_an_engine_without_an_approval_key_is_403(driver):
    client = TestClient(build_app(driver, Credentials(control_token="t")), headers=bearer_token("t"))
    planned = post(client, "/control/plan", {"kind": "cut", "target": {"cut": [3, 1]}, "incumbent_fingerprint": "fp-1"})
    body = {"plan": planned["plan"], "plan_hash": planned["plan_hash"], "attestation": attested(planned["plan_hash"])}
    assert "SEAM_APPROVAL_KEY" in post(client, "/control/apply", body, expect=403)["error"]
    assert driver.operations_by_id == {}


def test_a_job_whose_apply_the_driver_refused_may_apply_again(client):
    planned = post(client, "/control/plan", {"kind": "cut", "target": {"cut": [3, 1]}, "incumbent_fingerprint": "fp-1"})
    job_id = next(JOB_IDS)
    tampered = sign_attestation(CREDENTIALS.approval_key, "0" * 64, job_id, ["reviewer"], time.time(), lone_head())
    post(client, "/control/apply", {"plan": planned["plan"], "plan_hash": "0" * 64, "attestation": tampered}, 400)
    valid = sign_attestation(CREDENTIALS.approval_key, planned["plan_hash"], job_id, ["reviewer"], time.time(),
                             lone_head())
    post(client, "/control/apply", {"plan": planned["plan"], "plan_hash": planned["plan_hash"], "attestation": valid},
         202)  # nothing started the first time, so the job id is still unspent


class FailingApplyDriver(FakeDriver):
    """Fails an apply with something other than a refusal: as far as the service knows, an operation may have begun."""

    def apply(self, plan: dict, plan_hash: str, job_id: int | None = None) -> str:
        raise EngineError("the rank processes went away mid-apply")


def test_a_job_whose_apply_failed_otherwise_stays_spent():
    """Guard: JobLedger.claim (engine/control/job_ledger.py) frees a job id only when the driver refused the plan;
    after any
    other failure the same attestation cannot start a second operation."""
    client = _client(FailingApplyDriver())
    planned = post(client, "/control/plan", {"kind": "cut", "target": {"cut": [3, 1]}, "incumbent_fingerprint": "fp-1"})
    body = {"plan": planned["plan"], "plan_hash": planned["plan_hash"], "attestation": attested(planned["plan_hash"])}
    assert post(client, "/control/apply", body, expect=500)["error"].startswith("internal error (EngineError)")
    again = post(client, "/control/apply", body, expect=409)
    assert again["error"].startswith(f"job {body['attestation']['job_id']} already started an operation")


def test_an_unknown_operation_is_404(client):
    assert client.get("/control/operations/op-99").status_code == 404
    assert client.get("/control/operations/op-99").json() == {"error": "no operation op-99"}


def test_metrics_are_prometheus_text_from_the_snapshot_and_operations(client):
    samples = scrape(client)  # a driver without counters of its own: the snapshot's figures alone
    assert samples[("seam_telemetry_seq", ())] == SNAPSHOT.seq
    assert samples[("seam_engine_info", (("cut", "2,2"), ("phase", "serving")))] == 1
    assert samples[("seam_operations_known", (("status", "succeeded"),))] == 0
    assert not any(name.startswith("seam_prompt_tokens") for name, _ in samples)


def test_healthz(client):
    assert client.get("/healthz").json() == {"ok": True}


@pytest.mark.parametrize(("report", "status"), [(Health(True, "serving", None, 0, 0, None), 200),
                                                (Health(False, "serving", "recovering in a loop", 3, 3, "boom"), 503)])
def test_healthz_answers_the_drivers_health(driver, report, status):
    driver.health = lambda: report
    response = TestClient(build_app(driver, Credentials())).get("/healthz")  # open: no credentials needed
    assert response.status_code == status and response.json() == report.to_dict()


def test_unknown_routes_are_404_and_wrong_methods_405_in_each_shape(client):
    assert client.get("/v1/engines").json()["error"]["type"] == "not_found_error"
    assert client.get("/nowhere").status_code == 404 and isinstance(client.get("/nowhere").json()["error"], str)
    response = client.get("/v1/completions")
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert client.post("/control/state").status_code == 405 and "error" in client.post("/control/state").json()


class BrokenDriver(FakeDriver):
    def state(self) -> dict:
        raise RuntimeError("secret detail from deep inside")

    def submit(self, prompt, params) -> RequestHandle:
        raise KeyError("secret detail from deep inside")


def test_an_unexpected_driver_exception_is_a_clean_500(caplog):
    client = _client(BrokenDriver())
    with caplog.at_level(logging.ERROR, logger="engine.serve.http"):
        for response in (client.get("/control/state"), client.post("/v1/completions", json={"prompt": "a"})):
            assert response.status_code == 500 and response.headers["content-type"] == "application/json"
            assert "secret" not in response.text and "Traceback" not in response.text
    assert client.post("/v1/completions", json={"prompt": "a"}).json()["error"]["type"] == "server_error"
    assert "secret detail" in caplog.text  # the traceback is in the log instead
