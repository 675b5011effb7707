"""The real engine service with three rank processes on CPU, reconfigured live under load.

Every request completes with exactly the tokens it gets without any reconfiguration (greedy), the
pool the ranks measure equals the planner's prediction, and the state the service reports changes.
"""

import json
import random
import time
import uuid

import pytest
import redis

from contracts.control import EngineState, Health, Operation, OperationList, OperationStatus
from contracts.measurement import LayoutMeasurement
from contracts.plan import PlanReply
from contracts.telemetry import Snapshot, telemetry_keys
from engine.demo import make_demo_checkpoint
from engine.llm import LLM
from engine.runtime.sampler import SamplingParams
from tests.support.live_service import LiveService, run_concurrently

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("live-demo")
    make_demo_checkpoint(folder, force=True)
    return folder


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(11)
    return [[rng.randrange(3, 1024) for _ in range(rng.randrange(4, 120))] for _ in range(12)]


@pytest.fixture(scope="module")
def expected(checkpoint, prompts):
    """What each request gets on one rank with no reconfiguration at all."""
    llm = LLM(checkpoint)
    return [c.token_ids for c in llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))]


REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="module")
def channel():
    return f"seam:test-telemetry:{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def service(checkpoint, channel):
    # Not the run's shared engine: these tests reconfigure it under load and read its telemetry channel.
    live = LiveService(checkpoint, redis_url=REDIS_URL, channel=channel)
    yield live
    assert live.stop() in (0, -15)


def _telemetry_until(subscription, condition, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = subscription.get_message(timeout=1.0)
        if message and message["type"] == "message":
            snapshot = json.loads(message["data"])
            if condition(snapshot):
                return snapshot
    raise AssertionError("telemetry never showed the change")


def _reconfigure_under_load(service, prompts, kind, target):
    threads, results = run_concurrently(service, prompts, MAX_TOKENS)
    time.sleep(0.5)  # let the load get going: prefills and decodes in flight
    planned = service.plan(kind, target)
    assert planned["feasible"], planned["reasons"]
    reply = service.apply(planned)
    assert reply.status_code == 202, reply.text
    operation = service.wait_operation(reply.json()["operation_id"])
    for thread in threads:
        thread.join(timeout=180)
    return operation, results, planned


def test_three_ranks_give_the_single_rank_tokens(service, prompts, expected):
    threads, results = run_concurrently(service, prompts, MAX_TOKENS)
    for thread in threads:
        thread.join(timeout=180)
    assert results == expected
    state = service.state()
    assert state["cut"] == [7, 5, 4] and len(state["ranks"]) == 3


def test_a_cut_change_under_load_loses_nothing_and_matches_the_prediction(service, prompts, expected, channel):
    subscription = redis.Redis.from_url(REDIS_URL).pubsub()
    subscription.subscribe(channel)
    before = service.state()
    operation, results, planned = _reconfigure_under_load(service, prompts, "cut", {"cut": [8, 4, 4]})
    assert operation["status"] == "succeeded", operation
    assert results == expected
    assert operation["measured"]["pool_tokens"] == operation["predicted"]["pool_tokens"]
    assert operation["measured"]["pool_tokens"] == planned["plan"]["predicted"]["pool_tokens"]
    after = service.state()
    assert after["cut"] == [8, 4, 4] and after["fingerprint"] != before["fingerprint"]
    assert [rank["measured"]["layers"] for rank in after["ranks"]] == [[0, 8], [8, 12], [12, 16]]
    # Layers that stayed were not reloaded: rank 0 only gained layer 7.
    assert after["ranks"][0]["measured"]["loaded_layers"] == [7]
    shown = _telemetry_until(subscription, lambda snapshot: snapshot["engine"]["cut"] == [8, 4, 4])
    assert shown["engine"]["pool_tokens"] == operation["measured"]["pool_tokens"]
    assert [rank["kv"]["tokens_total"] for rank in shown["ranks"]] == [operation["measured"]["pool_tokens"]] * 3
    subscription.close()


def test_a_shape_change_under_load_loses_nothing(service, prompts, expected):
    operation, results, _ = _reconfigure_under_load(service, prompts, "shape",
                                                    {"max_num_seqs": 4, "max_num_batched_tokens": 128})
    assert operation["status"] == "succeeded", operation
    assert results == expected
    assert operation["measured"]["pool_tokens"] == operation["predicted"]["pool_tokens"]
    state = service.state()
    assert state["shape"]["max_num_seqs"] == 4
    assert all(rank["measured"]["state_slots"] == 4 for rank in state["ranks"])


def test_an_infeasible_plan_is_refused_and_changes_nothing(service):
    before = service.state()
    planned = service.plan("cut", {"cut": [3, 12, 1]})
    assert not planned["feasible"] and planned["reasons"]
    reply = service.apply(planned)
    assert reply.status_code == 422 and "infeasible" in reply.json()["error"]
    assert service.state()["fingerprint"] == before["fingerprint"]


def test_a_stale_fingerprint_is_refused(service):
    current = service.state()
    stale = service.plan("cut", {"cut": current["cut"][::-1] if current["cut"] != [4, 4, 8] else [8, 4, 4]})
    moved = service.plan("shape", {"max_num_seqs": 6})
    assert service.wait_operation(service.apply(moved).json()["operation_id"])["status"] == "succeeded"
    reply = service.apply(stale)
    assert reply.status_code == 409 and "plan again" in reply.json()["error"]


def test_a_tampered_plan_is_refused(service):
    planned = service.plan("shape", {"max_num_seqs": 5})
    planned["plan"]["target"]["max_num_seqs"] = 7
    reply = service.apply(planned)
    assert reply.status_code == 400 and "plan_hash" in reply.json()["error"]


@pytest.mark.slow  # an engine of its own for each fault
@pytest.mark.parametrize("fault, expect", [
    ({"SEAM_FAULT_CORRUPT_RANK": "1"}, "checksum mismatch"),
    ({"SEAM_FAULT_DIE_RANK": "2"}, "died"),
])
def test_a_failed_operation_rolls_back_and_loses_nothing(checkpoint, prompts, expected, fault, expect):
    live = LiveService(checkpoint, extra_env=fault)
    try:
        before = live.state()
        operation, results, _ = _reconfigure_under_load(live, prompts, "cut", {"cut": [6, 6, 4]})
        assert operation["status"] == "rolled_back", operation
        assert expect in operation["error"]
        assert operation["previous"]["pool_tokens"] == before["pool_tokens"]  # restored and verified
        assert results == expected  # nothing lost
        after = live.state()
        assert after["cut"] == before["cut"] and after["fingerprint"] == before["fingerprint"]
        assert after["phase"] == "serving"
    finally:
        live.stop()


@pytest.mark.slow  # an engine of its own, with a ladder armed
def test_a_ladder_move_under_load_refills_the_arena_and_loses_nothing(checkpoint, prompts, expected):
    live = LiveService(checkpoint, ladder="7,5,4;8,4,4;9,4,3")
    try:
        ladder = live.state()["ladder"]
        assert ladder["armed"] and ladder["current"] == [7, 5, 4]
        operation, results, planned = _reconfigure_under_load(live, prompts, "ladder", {"rung": [9, 4, 3]})
        assert operation["status"] == "succeeded", operation
        assert results == expected
        assert operation["measured"]["pool_tokens"] == operation["predicted"]["pool_tokens"] == \
            ladder["pools"]["9,4,3"]
        # The switch is measured and set beside the planner's prediction (slowest rank's image over its link).
        assert operation["predicted"]["switch_cost_s"] == planned["plan"]["predicted"]["switch_cost_s"] > 0
        assert operation["measured"]["switch_s"] > 0
        state = live.state()
        assert state["cut"] == [9, 4, 3]
        # Every rung keeps the arena: a rank's resident weights + arena are the same at every rung.
        resident = [r["measured"]["weights_bytes"] + r["measured"]["arena_bytes"] + r["measured"]["state_pool_bytes"]
                    for r in state["ranks"]]
        assert resident == ladder["pinned_bytes"]
        off_ladder = live.client.post("/control/plan", json={"kind": "ladder", "target": {"rung": [6, 6, 4]},
                                                             "incumbent_fingerprint": state["fingerprint"]})
        assert off_ladder.status_code == 400 and "not a rung" in off_ladder.json()["error"]
        # With a ladder armed the engine moves only on it: a cut plan is refused when planned, not at apply.
        cut_plan = live.client.post("/control/plan", json={"kind": "cut", "target": {"cut": [8, 4, 4]},
                                                           "incumbent_fingerprint": state["fingerprint"]})
        assert cut_plan.status_code == 422 and "ladder is armed" in cut_plan.json()["error"]
    finally:
        live.stop()


def test_operations_run_one_at_a_time(service):
    first = service.plan("shape", {"max_num_batched_tokens": 256})
    second = service.plan("shape", {"max_num_batched_tokens": 192})
    accepted = service.apply(first)
    assert accepted.status_code == 202
    refused = service.apply(second)  # busy, or made for the layout the first one is replacing
    assert refused.status_code == 409
    assert service.wait_operation(accepted.json()["operation_id"])["status"] == "succeeded"


def test_the_state_and_telemetry_carry_the_measurement_of_the_running_layout(service, channel, checkpoint):
    # A layout change of its own first: every completion from there on is counted, and the change cleared the rest.
    shape = service.state()["shape"]
    planned = service.plan("shape", {"max_num_seqs": 3 if shape["max_num_seqs"] != 3 else 5})
    assert service.wait_operation(service.apply(planned).json()["operation_id"])["status"] == "succeeded"
    cleared = LayoutMeasurement.from_dict(service.state()["measurement"])
    assert cleared.decode.steps == cleared.prefill.steps == cleared.latency.requests == 0
    assert cleared.decode.median_ms is None and cleared.latency.ttft_ms is None
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 1024) for _ in range(length)] for length in (9, 30, 17)]
    for prompt in prompts:
        reply = service.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 6, "temperature": 0,
                                                             "ignore_eos": True})
        assert reply.status_code == 200 and len(reply.json()["choices"][0]["token_ids"]) == 6, reply.text
    state = service.state()
    assert "stage_ms" not in state
    measurement = LayoutMeasurement.from_dict(state["measurement"])
    assert state["model"] == measurement.model == checkpoint.name and state["rig"] == measurement.rig == "cpu-demo"
    assert measurement.fingerprint == state["fingerprint"] == cleared.fingerprint
    assert list(measurement.cut) == state["cut"] and measurement.shape == state["shape"]
    # One request at a time: a prompt step gives each its first token, then five decode steps of one token.
    assert (measurement.prefill.steps, measurement.prefill.median_tokens) == (len(prompts), 17)
    assert (measurement.decode.steps, measurement.decode.median_tokens) == (5 * len(prompts), 1)
    for kind in ("decode", "prefill"):
        stats = measurement.stats(kind)
        assert len(stats.median_ms) == len(stats.spread_ms) == len(state["ranks"]) == 3
        assert all(ms > 0 for ms in stats.median_ms)
    pool = measurement.pool
    assert pool.predicted == pool.allocated == state["pool_tokens"] > 0
    assert pool.real <= pool.allocated and pool.real % state["shape"]["block_size"] == 0
    latency = measurement.latency
    assert latency.requests == len(prompts)  # the completions since the change, and nothing from before it
    assert latency.ttft_ms > 0 and latency.itl_ms > 0
    subscription = redis.Redis.from_url(REDIS_URL).pubsub()
    subscription.subscribe(channel)
    shown = _telemetry_until(subscription, lambda snapshot: snapshot["engine"]["fingerprint"] == state["fingerprint"])
    subscription.close()
    published = shown["engine"]["measurement"]
    assert _keys(published) == _keys(state["measurement"])
    again = LayoutMeasurement.from_dict(published, "snapshot.engine.measurement")
    # Nothing ran since: the published figures are the state's (only the 5 s throughput window moves on).
    assert (again.decode, again.prefill, again.pool, again.latency) == (measurement.decode, measurement.prefill,
                                                                        measurement.pool, measurement.latency)


def _keys(data: object, where: str = "") -> set[str]:
    """Every key path of a JSON object, nested ones as `pool.real`."""
    if not isinstance(data, dict):
        return set()
    return {f"{where}{key}" for key in data} | {path for key, value in data.items()
                                                for path in _keys(value, f"{where}{key}.")}


def test_every_reply_of_the_real_engine_is_its_contract_type(service, channel):
    """The control API's replies and the published snapshot parse into contracts/ types and write back the very same
    JSON: what the engine sends is the contracts' to_dict()."""
    state = service.state()
    assert EngineState.from_dict(state).to_dict() == state
    planned = service.plan("shape", {"max_num_batched_tokens": 128})
    assert PlanReply.from_dict(planned).to_dict() == planned
    operation = service.wait_operation(service.apply(planned).json()["operation_id"])
    parsed = Operation.from_dict(operation)
    assert parsed.to_dict() == operation and parsed.status is OperationStatus.SUCCEEDED and parsed.status.done
    found = service.client.get("/control/operations", params={"plan_hash": planned["plan_hash"]}).json()
    assert OperationList.from_dict(found).to_dict() == found and len(found["operations"]) == 1
    health = service.client.get("/healthz").json()
    assert Health.from_dict(health).to_dict() == health
    latest = json.loads(redis.Redis.from_url(REDIS_URL).get(telemetry_keys(channel)[0]))
    assert Snapshot.from_dict(latest).to_dict() == latest
