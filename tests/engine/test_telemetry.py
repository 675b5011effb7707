"""Telemetry publishing against the real Redis, the snapshot schema, and the Prometheus text."""

import copy
import itertools
import json
import logging
import shutil
import socket
import subprocess
import time
import uuid

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest

from contracts.layout import Cut
from contracts.measurement import NO_STEPS, Latency, LayoutMeasurement, PoolFigures, StageStats
from contracts.telemetry import telemetry_keys
from engine.telemetry.exposition import SnapshotCollector
from engine.telemetry.publisher import TelemetryPublisher, recent_since
from engine.telemetry.schema import validate_snapshot
from tests.support.metrics import parse_samples

REDIS_URL = "redis://127.0.0.1:6379/0"


def make_snapshot(seq: int, names=("r0", "r1")) -> dict:
    ranks = [{
        "rank": i, "name": name, "device": "cpu", "total_bytes": 32 * 2**20,
        "used": {"weights": 1000 + i, "kv_pool": 2000, "state_pool": 300, "arena": 0, "workspace": 400, "other": 5},
        "free_bytes": 5000, "corridor_floor_bytes": 700, "arming_floor_bytes": 900, "armable": True,
        "kv": {"tokens_total": 4096, "tokens_used": 128 * i}, "state_slots": {"total": 8, "used": 2},
    } for i, name in enumerate(names)]
    return {"seq": seq, "ts": time.time(), "ranks": ranks,
            "engine": {"cut": [9, 7], "shape": {"max_model_len": 2048}, "phase": "serving", "running": 3,
                       "waiting": 1, "prefill_tok_s": 812.5, "decode_tok_s": 64.25, "reconfiguring": False}}


def numbered(start: int = 1):
    counter = itertools.count(start)
    return lambda: make_snapshot(next(counter))


@pytest.fixture
def client():
    connection = redis.Redis.from_url(REDIS_URL)
    try:
        connection.ping()
    except redis.ConnectionError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    yield connection
    connection.close()


@pytest.fixture
def channel(client):
    name = f"seam:test:telemetry:{uuid.uuid4().hex}"
    yield name
    client.delete(*telemetry_keys(name))


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def subscribe(client, channel):
    pubsub = client.pubsub()
    pubsub.subscribe(channel)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"  # subscribed before the first publish
    return pubsub


def drain(pubsub, seconds: float) -> list[dict]:
    received, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.05)
        if message and message["type"] == "message":
            received.append(json.loads(message["data"]))
    return received


# --- publishing ---------------------------------------------------------------------------------

def test_subscriber_receives_numbered_snapshots_at_about_the_configured_rate(client, channel):
    pubsub = subscribe(client, channel)
    with TelemetryPublisher(numbered(), REDIS_URL, channel=channel, hz=10):
        received = drain(pubsub, 1.5)
    seqs = [snap["seq"] for snap in received]
    assert 8 <= len(seqs) <= 22, seqs  # ~15 expected; the band is loose on purpose
    assert seqs == list(range(1, len(seqs) + 1))
    assert received[0] == make_snapshot(1) | {"ts": received[0]["ts"]}
    pubsub.close()


def test_latest_and_recent_hold_what_was_published(client, channel):
    publisher = TelemetryPublisher(numbered(), REDIS_URL, channel=channel, hz=50).start()
    assert wait_until(lambda: publisher.published >= 10)
    publisher.stop()
    latest_key, recent_key = telemetry_keys(channel)
    assert json.loads(client.get(latest_key))["seq"] == publisher.last_seq == publisher.published
    recent = [json.loads(raw)["seq"] for raw in client.lrange(recent_key, 0, -1)]
    assert recent == list(range(publisher.published, 0, -1))  # newest first


def test_recent_list_is_capped(client, channel):
    publisher = TelemetryPublisher(numbered(), REDIS_URL, channel=channel, hz=100, recent=5).start()
    assert wait_until(lambda: publisher.published >= 12)
    publisher.stop()
    recent = [json.loads(raw)["seq"] for raw in client.lrange(telemetry_keys(channel)[1], 0, -1)]
    assert recent == list(range(publisher.published, publisher.published - 5, -1))


def test_a_subscriber_refetches_a_gap_by_seq(client, channel):
    pubsub = subscribe(client, channel)
    with TelemetryPublisher(numbered(), REDIS_URL, channel=channel, hz=50):
        received = drain(pubsub, 0.5)
    assert len(received) >= 8
    kept = [snap for snap in received if not 3 <= snap["seq"] <= 6]  # the subscriber lost seq 3..6
    last_seen = max(snap["seq"] for snap in kept if snap["seq"] < 3)
    refetched = recent_since(client, channel, last_seen)
    assert [snap["seq"] for snap in refetched][:4] == [3, 4, 5, 6]
    assert refetched[:4] == received[2:6]
    pubsub.close()


def test_a_failing_snapshot_is_logged_once_and_publishing_continues(client, channel, caplog):
    counter = itertools.count(1)

    def flaky():
        seq = next(counter)
        if seq == 2:
            raise RuntimeError("rank table not ready")
        return make_snapshot(seq)

    caplog.set_level(logging.INFO, logger="engine.telemetry.publisher")
    publisher = TelemetryPublisher(flaky, REDIS_URL, channel=channel, hz=50).start()
    assert wait_until(lambda: publisher.published >= 5)
    assert publisher.running
    publisher.stop()
    assert publisher.failures == 1
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1 and "rank table not ready" in caplog.text
    recent = [json.loads(raw)["seq"] for raw in client.lrange(telemetry_keys(channel)[1], 0, -1)]
    assert 2 not in recent and {1, 3, 4} <= set(recent)


def test_an_invalid_snapshot_is_not_published(client, channel, caplog):
    broken = make_snapshot(1)
    del broken["ranks"][0]["used"]["arena"]
    publisher = TelemetryPublisher(lambda: broken, REDIS_URL, channel=channel, hz=50).start()
    assert wait_until(lambda: publisher.failures >= 3)
    publisher.stop()
    assert publisher.published == 0 and client.get(telemetry_keys(channel)[0]) is None
    assert "snapshot.ranks[0].used.arena: missing" in caplog.text


def test_stop_joins_the_thread(channel):
    publisher = TelemetryPublisher(numbered(), REDIS_URL, channel=channel, hz=4).start()
    assert publisher.running
    started = time.monotonic()
    publisher.stop()
    assert not publisher.running and time.monotonic() - started < 2
    publisher.stop()  # a second stop is harmless


@pytest.mark.parametrize("hz", [0, -1, 100.5, float("nan"), True, "4"])
def test_rate_is_validated(hz):
    with pytest.raises(ValueError, match="hz"):
        TelemetryPublisher(numbered(), REDIS_URL, hz=hz)


def test_an_unreachable_redis_never_crashes_and_stop_is_prompt(caplog):
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    publisher = TelemetryPublisher(numbered(), f"redis://127.0.0.1:{port}/0", hz=20).start()
    time.sleep(0.8)
    assert publisher.running and publisher.published == 0
    started = time.monotonic()
    publisher.stop()
    assert not publisher.running and time.monotonic() - started < 3
    assert caplog.text.count("Redis unavailable") == 1  # logged once, not once per retry


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not on PATH")
def test_publishing_survives_redis_going_away_and_coming_back(caplog, tmp_path):
    # A private server on its own port: the shared one at 6379 must not be stopped by a test.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", str(tmp_path)]
    url = f"redis://127.0.0.1:{port}/0"
    own = redis.Redis.from_url(url)
    caplog.set_level(logging.INFO, logger="engine.telemetry.publisher")
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    publisher = None
    try:
        assert wait_until(lambda: _pings(own))
        publisher = TelemetryPublisher(numbered(), url, hz=20).start()
        assert wait_until(lambda: publisher.published >= 3)
        server.terminate()
        server.wait(5)
        time.sleep(1.0)
        assert publisher.running
        before = publisher.published
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        assert wait_until(lambda: publisher.published >= before + 3, timeout=15)
        latest = json.loads(own.get(telemetry_keys("seam:telemetry")[0]))
        assert latest["seq"] == publisher.last_seq
        # No seq was spent while Redis was away: the snapshot that failed is the first one stored after it.
        assert json.loads(own.lrange(telemetry_keys("seam:telemetry")[1], -1, -1)[0])["seq"] == before + 1
        assert caplog.text.count("Redis unavailable") == 1 and "Redis is back" in caplog.text
    finally:
        if publisher is not None:
            publisher.stop()
        own.close()
        server.terminate()
        server.wait(5)


def _pings(connection) -> bool:
    try:
        return connection.ping()
    except redis.ConnectionError:
        return False


# --- schema -------------------------------------------------------------------------------------

def test_a_complete_snapshot_validates_and_extra_keys_are_allowed():
    snapshot = make_snapshot(7)
    # Extra keys at every level: the schema grows and consumers ignore what they do not know.
    snapshot["build"] = "seam-dev"
    snapshot["engine"]["fingerprint"] = "abc"
    snapshot["ranks"][1]["pid"] = 4242
    snapshot["ranks"][1]["used"]["graphs"] = 12
    snapshot["ranks"][1]["kv"]["blocks_total"] = 256
    kept = copy.deepcopy(snapshot)
    assert validate_snapshot(snapshot) is None and snapshot == kept  # accepted, and nothing stripped or coerced
    # The validator did walk this snapshot: one ill-typed key beside the extras is caught, by its path.
    snapshot["ranks"][1]["kv"]["tokens_used"] = "128"
    with pytest.raises(ValueError, match=r"^snapshot\.ranks\[1\]\.kv\.tokens_used: expected int, got str"):
        validate_snapshot(snapshot)


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s.pop("seq"), "snapshot.seq: missing"),
    (lambda s: s.pop("engine"), "snapshot.engine: missing"),
    (lambda s: s["ranks"][1].pop("arming_floor_bytes"), "snapshot.ranks[1].arming_floor_bytes: missing"),
    (lambda s: s["ranks"][0]["used"].pop("kv_pool"), "snapshot.ranks[0].used.kv_pool: missing"),
    (lambda s: s["ranks"][0]["kv"].pop("tokens_used"), "snapshot.ranks[0].kv.tokens_used: missing"),
    (lambda s: s["engine"].pop("reconfiguring"), "snapshot.engine.reconfiguring: missing"),
    (lambda s: s.update(seq="7"), "snapshot.seq: expected int, got str"),
    (lambda s: s.update(ts=float("nan")), "snapshot.ts: expected number"),
    (lambda s: s["ranks"][0].update(free_bytes=True), "snapshot.ranks[0].free_bytes: expected int, got bool"),
    (lambda s: s["ranks"][0].update(armable=1), "snapshot.ranks[0].armable: expected bool, got int"),
    (lambda s: s["engine"].update(cut=[9, "7"]), "snapshot.engine.cut[1]: expected int"),
    (lambda s: s["engine"].update(shape=None), "snapshot.engine.shape: expected an object"),
    (lambda s: s.update(ranks={}), "snapshot.ranks: expected a list"),
])
def test_validate_snapshot_names_the_missing_or_ill_typed_key(mutate, message):
    snapshot = make_snapshot(1)
    mutate(snapshot)
    with pytest.raises(ValueError) as caught:
        validate_snapshot(snapshot)
    assert str(caught.value).startswith(message)


def test_validate_snapshot_refuses_a_non_object():
    with pytest.raises(ValueError, match="snapshot: expected an object"):
        validate_snapshot([])


# --- Prometheus text ----------------------------------------------------------------------------

def prometheus_text(snapshot: dict, operations: list[dict]) -> str:
    """The exposition of one snapshot, as the service's registry writes it (engine/telemetry/exposition.py)."""
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: (snapshot, operations)))
    return generate_latest(registry).decode()


def parse_exposition(text: str) -> dict[tuple, float]:
    return {(name, *labels): value for (name, labels), value in parse_samples(text).items()}


def test_prometheus_text_exposes_every_figure():
    operations = [{"status": "succeeded"}, {"status": "succeeded"}, {"status": "running"}]
    samples = parse_exposition(prometheus_text(make_snapshot(42), operations))
    rank = (("name", "r1"), ("rank", "1"))
    assert samples[("seam_rank_memory_bytes", ("category", "weights"), *rank)] == 1001
    assert samples[("seam_rank_memory_bytes", ("category", "kv_pool"), *rank)] == 2000
    assert samples[("seam_rank_free_bytes", *rank)] == 5000
    assert samples[("seam_rank_corridor_floor_bytes", *rank)] == 700
    assert samples[("seam_rank_arming_floor_bytes", *rank)] == 900
    assert samples[("seam_rank_armable", *rank)] == 1
    assert samples[("seam_kv_tokens_total", *rank)] == 4096 and samples[("seam_kv_tokens_used", *rank)] == 128
    assert samples[("seam_state_slots_total", *rank)] == 8 and samples[("seam_state_slots_used", *rank)] == 2
    assert samples[("seam_num_requests_running",)] == 3 and samples[("seam_num_requests_waiting",)] == 1
    assert samples[("seam_kv_cache_usage_perc",)] == 128 / 4096  # the fuller rank's
    assert samples[("seam_engine_prefill_tokens_per_second",)] == 812.5
    assert samples[("seam_engine_decode_tokens_per_second",)] == 64.25
    assert samples[("seam_engine_reconfiguring",)] == 0
    assert samples[("seam_engine_info", ("cut", "9,7"), ("phase", "serving"))] == 1
    assert samples[("seam_operations_known", ("status", "succeeded"))] == 2
    assert samples[("seam_operations_known", ("status", "running"))] == 1
    assert samples[("seam_operations_known", ("status", "rolled_back"))] == 0
    assert samples[("seam_telemetry_seq",)] == 42
    assert sum(1 for key in samples if key[0] == "seam_rank_memory_bytes") == 12  # 2 ranks x 6 categories


def test_prometheus_label_values_are_escaped():
    hostile = 'gpu "big"\\x4\nnext'
    text = prometheus_text(make_snapshot(1, names=(hostile, "r1")), [{"status": 'odd"status'}])
    assert 'name="gpu \\"big\\"\\\\x4\\nnext"' in text
    samples = parse_exposition(text)  # still one sample per line, and the value round-trips
    assert samples[("seam_rank_free_bytes", ("name", hostile), ("rank", "0"))] == 5000
    assert samples[("seam_operations_known", ("status", 'odd"status'))] == 1


def test_prometheus_text_refuses_a_malformed_snapshot():
    snapshot = copy.deepcopy(make_snapshot(1))
    del snapshot["engine"]["phase"]
    with pytest.raises(ValueError, match="snapshot.engine.phase: missing"):
        prometheus_text(snapshot, [])


def test_prometheus_text_reports_a_recovery_loop_as_unhealthy():
    snapshot = make_snapshot(3)
    snapshot["engine"].update(healthy=False, recoveries_in_a_row=3, recoveries=5)
    samples = parse_exposition(prometheus_text(snapshot, []))
    assert samples[("seam_engine_healthy",)] == 0
    assert samples[("seam_engine_recoveries_in_a_row",)] == 3 and samples[("seam_recoveries_total",)] == 5


def test_prometheus_text_exposes_pool_blocks_and_preemptions():
    snapshot = make_snapshot(4)
    snapshot["engine"].update(shape={"max_model_len": 2048, "block_size": 16}, preemptions=7)
    text = prometheus_text(snapshot, [])
    assert "# TYPE seam_num_preemptions_total counter" in text  # a counter: rate() and increase() apply
    samples = parse_exposition(text)
    assert samples[("seam_num_preemptions_total",)] == 7
    assert samples[("seam_kv_free_blocks", ("name", "r0"), ("rank", "0"))] == 4096 // 16
    assert samples[("seam_kv_free_blocks", ("name", "r1"), ("rank", "1"))] == (4096 - 128) // 16


def _measurement(decode: StageStats, prefill: StageStats, latency: Latency) -> dict:
    return LayoutMeasurement(model="demo", rig="cpu-demo", fingerprint="abc", cut=Cut((9, 7)),
                             shape={"max_model_len": 2048}, decode=decode, prefill=prefill, decode_tok_s=64.25,
                             prefill_tok_s=812.5, pool=PoolFigures(4096, 4096, 4096), latency=latency).to_dict()


def test_prometheus_text_exposes_stage_and_latency_medians():
    snapshot = make_snapshot(5)
    snapshot["engine"]["measurement"] = _measurement(StageStats(12, 1.0, (3.5, 2.25), (0.1, 0.2), 0.75, 1.5),
                                                     NO_STEPS, Latency(requests=4, ttft_ms=41.5, itl_ms=3.75))
    samples = parse_exposition(prometheus_text(snapshot, []))
    assert samples[("seam_engine_host_step_ms", ("kind", "decode"), ("quantile", "0.5"))] == 0.75
    assert samples[("seam_engine_host_step_ms", ("kind", "decode"), ("quantile", "0.9"))] == 1.5
    assert not any(key[0] == "seam_engine_host_step_ms" and ("kind", "prefill") in key for key in samples)
    assert samples[("seam_engine_stage_ms", ("kind", "decode"), ("name", "r0"), ("rank", "0"))] == 3.5
    assert samples[("seam_engine_stage_ms", ("kind", "decode"), ("name", "r1"), ("rank", "1"))] == 2.25
    assert not any(key[0] == "seam_engine_stage_ms" and ("kind", "prefill") in key for key in samples)  # no steps
    assert samples[("seam_engine_latency_requests",)] == 4
    assert samples[("seam_engine_ttft_ms",)] == 41.5 and samples[("seam_engine_itl_ms",)] == 3.75


def test_prometheus_text_leaves_out_latency_medians_it_does_not_have():
    snapshot = make_snapshot(6)
    snapshot["engine"]["measurement"] = _measurement(NO_STEPS, NO_STEPS, Latency(requests=0, ttft_ms=None,
                                                                                 itl_ms=None))
    samples = parse_exposition(prometheus_text(snapshot, []))
    assert samples[("seam_engine_latency_requests",)] == 0
    assert ("seam_engine_ttft_ms",) not in samples and ("seam_engine_itl_ms",) not in samples
    assert not any(key[0] == "seam_engine_stage_ms" for key in samples)
