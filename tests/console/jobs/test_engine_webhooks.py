"""The engine's own webhooks (console.jobs.webhooks, issue 34 item 9): a layout change no job caused and the engine's
health changes, noticed by the layout watch against the real engine and delivered, signed, to a real receiver by the
delivery task run in this process."""

from __future__ import annotations

import json

import pytest

from console.audit.models import AuditEvent
from console.engine import EngineClient
from console.jobs import health_watch, layout_watch, webhooks
from console.jobs.models import HealthObservation
from contracts.control import EngineState
from tests.support.jobs import move_engine
from tests.support.webhooks import KEY

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def delivered(monkeypatch) -> None:
    """Each delivery handed to the broker is run by the real task in this process at once (no worker needed)."""
    monkeypatch.setattr(webhooks.deliver, "apply_async", lambda args: webhooks.deliver.apply(args=args))


def _events(target, event: str) -> list[dict]:
    posts = [post for post in target.received if post["headers"]["X-Seam-Event"] == event]
    for post in posts:
        assert webhooks.signature_matches(post["body"], post["headers"]["X-Seam-Signature"], KEY)
    return [json.loads(post["body"]) for post in posts]


def test_a_layout_change_no_job_caused_is_announced(live_engine, receiver, hooked, delivered):
    target = hooked(receiver())
    before = live_engine.state()
    layout_watch.watch()
    moved = move_engine(live_engine)
    assert layout_watch.watch().startswith("unexplained")
    assert layout_watch.watch() == f"unchanged: layout {moved}"  # announced once per change
    [event] = _events(target, webhooks.UNEXPLAINED_CHANGE)
    engine = event["engine"]
    assert engine["url"] == live_engine.url
    assert engine["before"]["fingerprint"] == before["fingerprint"] and engine["after"]["fingerprint"] == moved
    audited = AuditEvent.objects.get(action=layout_watch.UNEXPLAINED_CHANGE)
    assert engine["observation"] == audited.payload["observation"]
    assert event["audit_head"]["seq"] == AuditEvent.objects.order_by("-seq").first().seq


def test_health_changes_are_announced_once_each_and_recovery_too(live_engine, receiver, hooked, delivered):
    target = hooked(receiver())
    assert layout_watch.watch()  # first sight of a healthy engine: noted, not announced
    assert HealthObservation.objects.known(live_engine.url).status == "ok" and target.received == []
    with EngineClient(live_engine.url, token="not-the-control-token") as refused:  # its state cannot be read
        layout_watch.watch(refused)
        layout_watch.watch(refused)
    layout_watch.watch()
    down, up = _events(target, webhooks.ENGINE_HEALTH)
    assert down["engine"]["url"] == live_engine.url
    assert down["engine"]["before"] == {"status": "ok", "reason": ""}
    assert down["engine"]["after"]["status"] == "unreachable" and "401" in down["engine"]["after"]["reason"]
    assert up["engine"]["before"] == down["engine"]["after"] and up["engine"]["after"] == {"status": "ok",
                                                                                          "reason": ""}
    changes = AuditEvent.objects.filter(action=health_watch.HEALTH_CHANGED).order_by("seq")
    assert [event.after["status"] for event in changes] == ["unreachable", "ok"]
    assert all(event.actor is None for event in changes)


def test_an_engine_first_seen_unhealthy_is_announced_with_its_reason(live_engine, receiver, hooked, delivered):
    target = hooked(receiver())
    state = live_engine.state()
    broken = EngineState.from_dict({**state, "health": {**state["health"], "ok": False, "phase": "broken",
                                                         "reason": "recovery loop: 3 recoveries in a row"}})
    assert health_watch.health_of(broken) == ("unhealthy", "recovery loop: 3 recoveries in a row")
    assert health_watch.note_health("http://engine.example:8100", *health_watch.health_of(broken)) \
        == "health unknown -> unhealthy"
    [event] = _events(target, webhooks.ENGINE_HEALTH)
    assert event["engine"] == {"url": "http://engine.example:8100", "before": None,
                               "after": {"status": "unhealthy", "reason": "recovery loop: 3 recoveries in a row"}}
