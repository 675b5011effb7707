"""Dashboard: rendered from the newest snapshot in (real) Redis, with its seq for the live fetch."""

import json
import re
import time
import uuid

import pytest
import redis

pytestmark = pytest.mark.django_db


def snapshot(seq: int, cut=(8, 4, 4), used_tokens=96) -> dict:
    ranks = []
    for rank, layers in enumerate(cut):
        ranks.append({
            "rank": rank, "name": f"cpu-rank{rank}", "device": "cpu", "total_bytes": 32 << 20,
            "used": {"weights": 8 << 20, "kv_pool": 4 << 20, "state_pool": 1 << 20, "arena": 0, "workspace": 2 << 20,
                     "other": 0},
            "free_bytes": 17 << 20, "corridor_floor_bytes": 1677721, "arming_floor_bytes": 3250585,
            "armable": rank != 2, "kv": {"tokens_total": 17056 if layers else 0, "tokens_used": used_tokens},
            "state_slots": {"total": 8, "used": 1},
        })
    return {"seq": seq, "ts": 1700000000.0 + seq, "ranks": ranks, "engine": {
        "cut": list(cut), "shape": {"max_model_len": 2048, "max_num_seqs": 8, "kv_dtype": "fp32"},
        "phase": "serving", "running": 2, "waiting": 1, "prefill_tok_s": 120.5, "decode_tok_s": 33.0,
        "reconfiguring": False, "binding_rank": 0, "pool_tokens": 17056}}


@pytest.fixture
def channel(settings):
    """A telemetry channel of this test's own on the real Redis, emptied afterwards."""
    settings.TELEMETRY_CHANNEL = f"seam-ui-test:{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client, settings.TELEMETRY_CHANNEL
    client.delete(f"{settings.TELEMETRY_CHANNEL}:latest", f"{settings.TELEMETRY_CHANNEL}:recent")
    client.close()


def publish(channel, *snapshots):
    client, name = channel
    for snap in snapshots:
        client.set(f"{name}:latest", json.dumps(snap))
        client.lpush(f"{name}:recent", json.dumps(snap))


def embedded(page: str, element_id: str):
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(match.group(1))


def test_dashboard_renders_the_latest_snapshot_and_its_seq(browse, viewer, channel):
    publish(channel, snapshot(41, cut=(7, 5, 4)), snapshot(42))
    page = browse(viewer).get("/").content.decode()
    assert '<span data-testid="telemetry-seq" id="telemetry-seq">42</span>' in page
    assert 'data-testid="current-cut" id="current-cut" data-cut="8,4,4"' in page
    assert 'data-testid="kv-pool-total" id="kv-pool-total" data-tokens="17056"' in page
    assert 'data-testid="kv-pool-used" id="kv-pool-used" data-tokens="96"' in page
    assert '<span data-testid="binding-rank" id="binding-rank">0</span>' in page
    assert '<span data-testid="phase" id="phase">serving</span>' in page
    assert [int(rank) for rank in re.findall(r'data-testid="rank-bar" data-rank="(\d+)"', page)] == [0, 1, 2]
    assert embedded(page, "telemetry-snapshot")["seq"] == 42
    history = embedded(page, "telemetry-history")
    assert [point["seq"] for point in history] == [41, 42]
    assert history[-1]["engine"] == {"prefill_tok_s": 120.5, "decode_tok_s": 33.0, "running": 2, "waiting": 1}


def test_dashboard_loads_plotly_locally_and_the_live_script(browse, viewer, channel):
    publish(channel, snapshot(1))
    page = browse(viewer).get("/").content.decode()
    assert 'src="/static/plotly/plotly.min.js"' in page and "cdn" not in page.lower()
    assert 'src="/static/js/dashboard.js"' in page
    client = browse(viewer)
    assert client.get("/static/plotly/plotly.min.js").status_code == 200
    assert client.get("/static/js/dashboard.js").status_code == 200


def test_dashboard_without_any_snapshot_says_so(browse, viewer, channel):
    page = browse(viewer).get("/").content.decode()
    assert "No telemetry yet" in page and "hidden" not in page.split('id="no-telemetry"')[1][:20]
    assert '<span data-testid="telemetry-seq" id="telemetry-seq"></span>' in page
    assert embedded(page, "telemetry-snapshot") is None


def test_dashboard_with_redis_down_says_so_instead_of_failing(browse, viewer, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = browse(viewer).get("/")
    assert response.status_code == 200
    assert "telemetry store at redis://127.0.0.1:1/0 is unreachable" in response.content.decode()


def test_a_corrupt_snapshot_is_reported_not_rendered(browse, viewer, channel):
    client, name = channel
    client.set(f"{name}:latest", "not json")
    response = browse(viewer).get("/")
    assert response.status_code == 200
    assert "is not a telemetry snapshot" in response.content.decode()


def measurement(decode_steps=12, requests=5) -> dict:
    """engine.measurement as the engine sends it (contracts/measurement.py LayoutMeasurement.to_dict())."""
    def stats(steps, medians, spreads):
        return {"steps": steps, "median_tokens": 1.0 if steps else None,
                "median_ms": medians if steps else None, "spread_ms": spreads if steps else None}
    return {"model": "demo-hybrid-16", "rig": "cpu-demo", "fingerprint": "0123456789abcdef", "cut": [8, 4, 4],
            "shape": {"max_model_len": 2048, "max_num_seqs": 8}, "decode": stats(decode_steps, [12.345, 6.5, 4.0],
                                                                                [0.5, 0.25, 0.1]),
            "prefill": stats(0, None, None), "decode_tok_s": 33.0, "prefill_tok_s": 120.5,
            "pool": {"predicted": 17056, "allocated": 17056, "real": 17056},
            "latency": {"requests": requests, "ttft_ms": 81.5 if requests else None,
                        "itl_ms": 12.25 if requests else None}}


def with_measurement(seq: int, measured: object) -> dict:
    snap = snapshot(seq)
    snap["engine"]["fingerprint"] = "0123456789abcdef"
    snap["engine"]["measurement"] = measured
    return snap


def text_of(page: str, testid: str) -> str:
    return re.search(rf'data-testid="{testid}"[^>]*>([^<]*)<', page).group(1).strip()


def stage_rows(page: str) -> list[tuple[str, str, str]]:
    return re.findall(r'data-testid="stage-row" data-rank="(\d+)">.*?data-testid="stage-decode">([^<]*)<.*?'
                      r'data-testid="stage-prefill">([^<]*)<', page, re.S)


def test_dashboard_shows_model_rig_fingerprint_stage_times_and_latency(browse, viewer, channel):
    publish(channel, with_measurement(7, measurement()))
    page = browse(viewer).get("/").content.decode()
    assert text_of(page, "engine-model") == "demo-hybrid-16"
    assert text_of(page, "engine-rig") == "cpu-demo"
    assert text_of(page, "engine-fingerprint") == "0123456789abcdef"
    # decode: median ± spread per rank; prefill had no steps in the window
    assert stage_rows(page) == [("0", "12.35 ± 0.50 ms", "—"), ("1", "6.50 ± 0.25 ms", "—"),
                                ("2", "4.00 ± 0.10 ms", "—")]
    assert 'data-testid="stages-not-measured" id="stages-not-measured" hidden' in page
    assert text_of(page, "latency-ttft") == "81.50 ms" and text_of(page, "latency-itl") == "12.25 ms"


@pytest.mark.parametrize("measured", [None, measurement(decode_steps=0, requests=0)], ids=["absent", "no-steps"])
def test_dashboard_says_not_measured_yet(browse, viewer, channel, measured):
    publish(channel, with_measurement(8, measured))
    page = browse(viewer).get("/").content.decode()
    assert stage_rows(page) == []
    assert 'data-testid="stages-not-measured" id="stages-not-measured">' in page  # shown, not hidden
    assert text_of(page, "latency-ttft") == text_of(page, "latency-itl") == "not measured yet"
    assert text_of(page, "engine-fingerprint") == "0123456789abcdef"


def test_a_malformed_measurement_is_named_not_a_500(browse, viewer, channel):
    broken = measurement()
    broken["decode"]["median_ms"] = [1.0]  # one rank's figure for a three-rank cut
    publish(channel, with_measurement(9, broken))
    response = browse(viewer).get("/")
    assert response.status_code == 200
    assert "measurement.decode" in text_of(response.content.decode(), "measurement-error")


def aged(seq: int, age_s: float) -> dict:
    """A snapshot the engine published `age_s` seconds ago."""
    return {**snapshot(seq), "ts": time.time() - age_s}


@pytest.mark.parametrize("query, expected", [
    ("", [1, 2, 3, 4]),  # no range: the recent snapshots as held, as before there was a range
    ("?range=24h", [1, 2, 3, 4]), ("?range=6h", [2, 3, 4]), ("?range=1h", [3, 4]), ("?range=15m", [4]),
])
def test_the_charts_show_only_their_time_range(browse, viewer, channel, query, expected):
    publish(channel, aged(1, 7 * 3600), aged(2, 2 * 3600), aged(3, 20 * 60), aged(4, 60))
    response = browse(viewer).get(f"/{query}")
    page = response.content.decode()
    assert response.status_code == 200
    assert [point["seq"] for point in embedded(page, "telemetry-history")] == expected
    key = query.removeprefix("?range=") or "recent"
    assert embedded(page, "telemetry-range") == {"": None, "24h": 86400, "6h": 21600, "1h": 3600, "15m": 900}[
        query.removeprefix("?range=")]
    links = re.findall(r'<a href="([^"]*)" data-range="([^"]+)"( aria-current="true")?>', page)
    assert [(href, name) for href, name, _ in links] == [("/", "recent"), ("/?range=15m", "15m"),
                                                        ("/?range=1h", "1h"), ("/?range=6h", "6h"),
                                                        ("/?range=24h", "24h")]
    assert [name for _, name, current in links if current] == [key]
    assert embedded(page, "telemetry-snapshot")["seq"] == 4  # the newest snapshot whatever the range


def test_an_unknown_time_range_is_a_400_naming_the_ranges(browse, viewer, channel):
    publish(channel, aged(1, 60))
    response = browse(viewer).get("/?range=7d")
    assert response.status_code == 400
    error = text_of(response.content.decode(), "form-error")
    assert error.startswith("range: 7d is not a time range") and "15m, 1h, 6h, 24h" in error
