"""Redis restarts under a live dashboard (the real stack, Chromium): the page shows `reconnecting`, then `live`
again, its telemetry has no gap beyond what died with Redis, and jobs around the restart run exactly once.

What "no gap beyond what Redis lost" means here: the engine spends no seq while Redis is away (it retries the
same snapshot), so the only snapshots the page may never get are those published to the old Redis after the
last one the page showed before the kill — seqs in (seq on the page at the kill, newest seq in Redis's recent
buffer just before the kill + 1]. Every other seq from the first the page received to the last must have
arrived, pushed live or fetched after the reconnect (how many came each way depends on which reconnects
first, the engine's publisher or the page: it is printed, not asserted)."""

from __future__ import annotations

import json
import time

import pytest
import redis
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.support.browser import WATCH_SCRIPT, SocketLog, chromium, log_in, seen
from tests.support.pages import current_seq, wait_for_seq_above
from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.slow
TERMINAL = {"succeeded", "failed", "rolled_back", "rejected", "stale", "cancelled"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_stack(tmp_path_factory.mktemp("redis-restart")) as running:
        yield running


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


def _other_cut(stack: Stack) -> list[int]:
    frontier = stack.api("operator").get("frontier/").json()
    return next(point["cut"] for point in frontier["points"] if point["cut"] != frontier["incumbent"]["cut"])


def _propose(stack: Stack) -> int:
    reply = stack.api("operator").post("jobs/", json={"kind": "cut", "target": {"cut": _other_cut(stack)}})
    assert reply.status_code == 201, reply.text
    return reply.json()["id"]


def _approve(stack: Stack, job_id: int) -> None:
    plan_hash = stack.api("reviewer").get(f"jobs/{job_id}/").json()["plan_hash"]
    reply = stack.api("reviewer").post(f"jobs/{job_id}/approve/", json={"plan_hash": plan_hash})
    assert reply.status_code == 200, reply.text


def _wait_status(stack: Stack, job_id: int, done: set[str], timeout: float) -> str:
    api = stack.api("operator")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = api.get(f"jobs/{job_id}/").json()["status"]
        if status in done:
            return status
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} still {status} after {timeout}s")


def _actions(stack: Stack, job_id: int) -> list[str]:
    events = stack.api("operator").get("audit/", params={"subject": f"job:{job_id}", "page_size": 100}).json()
    return [event["action"] for event in reversed(events["results"])]


def test_redis_restart_under_a_live_dashboard_loses_no_snapshot_it_kept_and_runs_jobs_once(
        stack, browser, record_property):
    recent_key = "seam:telemetry:recent"
    context, page = log_in(browser, stack, "operator")
    context.add_init_script(WATCH_SCRIPT)
    sockets = SocketLog(page)
    page.reload()
    page.wait_for_function("document.querySelector('[data-testid=live-status]').textContent === 'live'")
    wait_for_seq_above(page, current_seq(page) + 2)

    # A job approved just before the kill: the worker has it (it left `queued`) when Redis goes.
    before = _propose(stack)
    _approve(stack, before)
    _wait_status(stack, before, {"running"} | TERMINAL, timeout=20)
    seq_on_page = current_seq(page)
    newest_in_redis = json.loads(redis.Redis.from_url(stack.redis.url).lindex(recent_key, 0))["seq"]
    stack.redis.kill()

    page.wait_for_function("document.querySelector('[data-testid=live-status]').textContent === 'reconnecting'",
                           timeout=15_000)
    time.sleep(1.0)
    stack.redis.start()
    restarted = time.monotonic()
    # The page retries with a doubling delay capped at 10 s; a socket the server accepted but never subscribed
    # (seen in full runs: the consumer stalled across the restart) is dropped by the page after 5 s and retried.
    try:
        page.wait_for_function("document.querySelector('[data-testid=live-status]').textContent === 'live'",
                               timeout=90_000)
    except PlaywrightTimeout:
        raise AssertionError("the page did not come back live after the Redis restart; the stack printed:\n"
                             + stack.printed()[-4000:]) from None
    record_property("seconds_to_live_again", round(time.monotonic() - restarted, 1))
    # A job proposed and approved while the rest is still reconnecting (once the first has settled: a plan
    # proposed before it changed the cut would rightly end stale).
    _wait_status(stack, before, TERMINAL, timeout=60)
    after = _propose(stack)
    _approve(stack, after)
    resumed = wait_for_seq_above(page, newest_in_redis + 3, timeout_ms=30_000)

    received = sockets.telemetry_seqs()
    may_be_lost = set(range(seq_on_page + 1, newest_in_redis + 2))
    missing = set(range(min(received), max(received) + 1)) - set(received)
    last_subscribe = max(i for i, message in enumerate(sockets.messages) if message.get("type") == "subscribed")
    fetched = sum(len(message.get("snapshots", ())) for message in sockets.messages[last_subscribe:]
                  if message.get("type") == "fetched")
    record_property("seqs_missing", sorted(missing))
    record_property("seqs_fetched_after_the_reconnect", fetched)
    print(f"page at seq {seq_on_page} and Redis at {newest_in_redis} at the kill; the page resumed to {resumed}, "
          f"missed {sorted(missing)} (allowed: {sorted(may_be_lost)}), {fetched} fetched after the reconnect, "
          f"{sockets.sockets} websockets opened; live states {seen(page, 'live')}")
    assert missing <= may_be_lost, f"seqs lost beyond what died with Redis: {sorted(missing - may_be_lost)}"
    assert max(received) >= newest_in_redis + 3
    assert sockets.sockets >= 2, "the page never opened a new websocket"
    live_states = seen(page, "live")
    assert live_states[-1] == "live" and "reconnecting" in live_states[live_states.index("live"):]
    context.close()

    for job_id in (before, after):
        assert _wait_status(stack, job_id, TERMINAL, timeout=60) == "succeeded"
    time.sleep(2.0)  # a second delivery, if any, would have run by now
    for job_id in (before, after):
        actions = _actions(stack, job_id)
        assert actions.count("job.running") == 1, actions
        assert actions.count("job.applied") == 1, actions
        assert sum(action in {f"job.{status}" for status in TERMINAL} for action in actions) == 1, actions
    assert stack.api("operator").get("telemetry/latest/").json()["engine"]["cut"] == \
        stack.api("operator").get(f"jobs/{after}/").json()["target"]["cut"]
