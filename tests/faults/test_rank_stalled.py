"""SIGSTOP one rank process of the real engine service for longer than its step (or build) timeout, then SIGCONT:
the driver stops waiting at the timeout, replaces every rank process (their process group is broken for good once
gloo timed out), restores the layout, proves it with a test step, and the requests complete. Timeouts are seconds
here (SEAM_STEP_TIMEOUT_S, SEAM_BUILD_TIMEOUT_S, SEAM_PIPELINE_TIMEOUT_S); their defaults are a minute and more."""

from __future__ import annotations

import random
import re
import threading
import time

import pytest

from tests.support.faults import operations_total, rank_held, rank_pids, wait_until
from tests.support.jobs import other_cut
from tests.support.live_service import LiveService

pytestmark = pytest.mark.slow

STEP_TIMEOUT_S, BUILD_TIMEOUT_S, PIPELINE_TIMEOUT_S = 12, 15, 4
STALL_S = 2 * STEP_TIMEOUT_S + 5
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def engine(demo_checkpoint):
    # Not the run's shared engine: short step, build and pipeline timeouts, and ranks these tests stall and replace.
    live = LiveService(demo_checkpoint, extra_env={"SEAM_STEP_TIMEOUT_S": str(STEP_TIMEOUT_S),
                                                   "SEAM_BUILD_TIMEOUT_S": str(BUILD_TIMEOUT_S),
                                                   "SEAM_PIPELINE_TIMEOUT_S": str(PIPELINE_TIMEOUT_S)})
    yield live
    live.stop()


def test_a_rank_stalled_under_requests_is_replaced_and_the_requests_complete(engine):
    rng = random.Random(9)
    prompts = [[rng.randrange(3, 1000) for _ in range(rng.randrange(4, 40))] for _ in range(3)]
    expected = [engine.complete(prompt, MAX_TOKENS) for prompt in prompts]  # undisturbed
    pids, before = rank_pids(engine), operations_total(engine)

    with rank_held(pids[1]):  # SIGSTOP now, SIGCONT on the way out (if the process is still there)
        threads = [Completion(engine, prompt) for prompt in prompts]
        time.sleep(STALL_S)

    # The requests that were in flight complete, with the tokens of an undisturbed run: the stalled step failed,
    # they were requeued, and ran again on the replaced ranks.
    assert [thread.result() for thread in threads] == [(200, tokens) for tokens in expected]
    assert [engine.complete(prompt, MAX_TOKENS) for prompt in prompts] == expected  # and so do new ones
    recoveries = operations_total(engine) - before
    assert 1 <= recoveries <= 2, recoveries  # one recovery (two if a step of a loaded machine timed out too)

    health = engine.client.get("/healthz")
    assert health.status_code == 200 and health.json()["ok"] is True, health.text
    # The driver stopped waiting at the step timeout (without one it waits for the rank as long as it is stopped).
    assert health.json()["recoveries_in_a_row"] == 0
    assert f"rank 1: no reply to step within {STEP_TIMEOUT_S} s: the rank is stalled" in health.json()["last_error"]
    replaced = rank_pids(engine)
    assert not set(replaced) & set(pids) and len(set(replaced)) == 3, (pids, replaced)  # every rank was replaced
    assert engine.state()["phase"] == "serving"


def test_a_rank_stalled_past_the_transfer_timeout_is_replaced_not_rebuilt_in_the_broken_group(engine):
    """The issue's own sequence: the stalled rank is back before the driver gives up on it, but its peers' transfers
    timed out meanwhile, so gloo closed their pairs and every later step would fail ('pair closure')."""
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 1000) for _ in range(rng.randrange(4, 40))] for _ in range(2)]
    expected = [engine.complete(prompt, MAX_TOKENS) for prompt in prompts]
    pids, before = rank_pids(engine), operations_total(engine)

    with rank_held(pids[1]):
        threads = [Completion(engine, prompt) for prompt in prompts]
        wait_until(lambda: running_requests(engine) > 0, what="a step to start")
        time.sleep((PIPELINE_TIMEOUT_S + STEP_TIMEOUT_S) / 2)  # past the ranks' transfer timeout, not the driver's

    assert [thread.result() for thread in threads] == [(200, tokens) for tokens in expected]
    assert operations_total(engine) - before == 1
    last_error = engine.client.get("/healthz").json()["last_error"]
    assert "TransportError" in last_error and "no reply" not in last_error, last_error
    assert not set(rank_pids(engine)) & set(pids)
    # Replaced at once: not first rebuilt and test-stepped in the group gloo had closed.
    assert not any("in place failed" in line for line in engine.output), "".join(engine.output[-20:])
    assert [engine.complete(prompt, MAX_TOKENS) for prompt in prompts] == expected


def running_requests(engine: LiveService) -> int:
    found = re.search(r"^seam_num_requests_running ([0-9.]+)$", engine.client.get("/metrics").text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def test_a_build_that_never_returns_rolls_back_on_replaced_ranks(engine):
    before, pids = engine.state(), rank_pids(engine)
    planned = engine.plan("cut", {"cut": other_cut(engine)})
    with rank_held(pids[2]):
        reply = engine.apply(planned)
        assert reply.status_code == 202, reply.text
        operation_id = reply.json()["operation_id"]
        wait_until(lambda: engine.client.get(f"/control/operations/{operation_id}").json()["phase"] == "acting",
                   what="the operation to act")
        done = engine.wait_operation(operation_id, timeout=BUILD_TIMEOUT_S + 180)

    assert done["status"] == "rolled_back", done
    assert f"rank 2: no reply to build within {BUILD_TIMEOUT_S} s: the rank is stalled" in done["error"]
    assert "every rank process was replaced" in " ".join(done["notes"])
    assert done["previous"]["pool_tokens"] == before["pool_tokens"]
    after = engine.state()
    assert (after["phase"], after["cut"], after["fingerprint"]) == ("serving", before["cut"], before["fingerprint"])
    assert not set(rank_pids(engine)) & set(pids)
    assert engine.client.get("/healthz").json()["ok"] is True


class Completion:
    """One greedy completion on a thread of its own; result() -> (status, token ids or the error body)."""

    def __init__(self, engine: LiveService, prompt: list[int]):
        self.outcome: tuple[int, object] | None = None
        self.thread = threading.Thread(target=self._run, args=(engine, prompt), daemon=True)
        self.thread.start()

    def _run(self, engine: LiveService, prompt: list[int]) -> None:
        status, body = complete(engine, prompt)
        self.outcome = (status, body["choices"][0]["token_ids"] if status == 200 else body)

    def result(self, timeout: float = 300) -> tuple[int, object] | None:
        self.thread.join(timeout)
        return self.outcome


@pytest.fixture(scope="module")
def doomed_engine(demo_checkpoint):
    """An engine whose last rank fails every step with token 0 in it: the test step of a recovery uses token 0, so
    every layout it restores builds and verifies, and then cannot step (as a layout rebuilt in a closed gloo group)."""
    live = LiveService(demo_checkpoint, extra_env={"SEAM_FAULT_STEP_TOKEN": "0"})  # a fault of its own
    yield live
    live.stop()


def test_a_recovery_whose_test_step_fails_leaves_the_engine_broken_and_says_so(doomed_engine):
    status, body = complete(doomed_engine, [0, 5, 6])
    assert status == 400 and "could not restore a verified layout" in body["error"]["message"], body
    health = doomed_engine.client.get("/healthz")
    assert health.status_code == 503 and health.json()["phase"] == "broken", health.text
    assert "restoring the previous layout failed too" in health.json()["reason"]
    assert "seam_engine_healthy 0" in doomed_engine.client.get("/metrics").text
    status, body = complete(doomed_engine, [5, 6, 7])  # and says so to every later request, at once
    assert status == 400 and "restart it" in body["error"]["message"], body


def complete(engine: LiveService, prompt: list[int]) -> tuple[int, dict]:
    reply = engine.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0},
                               headers=engine.api_headers(), timeout=300)
    return reply.status_code, reply.json()
