"""Signed webhooks on job status changes (console.jobs.webhooks): a real HTTP receiver (http.server on a thread) gets
the POSTs, from the delivery task run in this process and from a real Celery worker after a committed change."""

import hashlib
import hmac
import json
import logging

import pytest

from console.jobs import lifecycle, webhooks
from console.jobs.models import Job
from tests.support.jobs import other_cut
from tests.support.webhooks import KEY


def a_job(operator) -> Job:
    """A proposed job made directly (these tests change its status; they never reach an engine)."""
    plan = {"kind": "cut", "target": {"cut": [8, 4, 4]}, "incumbent_fingerprint": "feedfacefeedface", "predicted": {}}
    return Job.objects.create(kind="cut", target=plan["target"], plan=plan, plan_hash="ab" * 32, prediction={},
                              proposer=operator, proposer_name=operator.get_username())


def signed(url: str, event: dict) -> tuple:
    body = json.dumps(event, sort_keys=True, separators=(",", ":"))
    return url, body, webhooks.sign(body.encode(), KEY), event["delivery"]


def hmac_hex(key: str, body: bytes) -> str:
    return hmac.new(key.encode(), body, hashlib.sha256).hexdigest()


# --- the signature -------------------------------------------------------------------------------

def test_the_signature_is_an_hmac_of_the_exact_body():
    body = b'{"event":"job.status","job":{"id":1}}'
    assert webhooks.sign(body, KEY) == "sha256=" + hmac_hex(KEY, body)
    assert webhooks.signature_matches(body, webhooks.sign(body, KEY), KEY)
    assert not webhooks.signature_matches(body, webhooks.sign(body, "another-key"), KEY)
    assert not webhooks.signature_matches(body + b" ", webhooks.sign(body, KEY), KEY)
    assert not webhooks.signature_matches(body, "", KEY)


# --- the delivery task, run in this process ------------------------------------------------------

def test_a_delivery_posts_the_signed_body_and_its_headers(receiver, settings):
    target = receiver(204)
    event = {"event": "job.status", "delivery": "d-1", "ts": "2026-12-03T10:00:00+00:00", "job": {"id": 7}}
    assert webhooks.deliver.apply(args=signed(target.url, event)).get() == 204
    (post,) = target.received
    assert post["path"] == "/hooks/seam" and json.loads(post["body"]) == event
    headers = post["headers"]
    assert headers["Content-Type"] == "application/json" and headers["X-Seam-Delivery"] == "d-1"
    assert headers["X-Seam-Signature"] == "sha256=" + hmac_hex(KEY, post["body"])
    assert headers["X-Seam-Signature"] != "sha256=" + hmac_hex("another-key", post["body"])


def test_a_receiver_answering_500_gets_the_same_delivery_again(receiver, settings):
    settings.SEAM_WEBHOOK_RETRIES = 5
    target = receiver(500, 503, 200)
    event = {"event": "job.status", "delivery": "d-2", "ts": "2026-12-03T10:00:00+00:00", "job": {"id": 7}}
    assert webhooks.deliver.apply(args=signed(target.url, event)).get() == 200
    assert len(target.received) == 3
    assert len({post["body"] for post in target.received}) == 1  # byte for byte the same body, so the same signature
    assert {post["headers"]["X-Seam-Delivery"] for post in target.received} == {"d-2"}


def test_retries_are_bounded_and_the_final_failure_is_logged(receiver, settings, caplog):
    settings.SEAM_WEBHOOK_RETRIES = 2
    target = receiver(500)
    event = {"event": "job.status", "delivery": "d-3", "ts": "2026-12-03T10:00:00+00:00", "job": {"id": 7}}
    with caplog.at_level(logging.WARNING, logger="seam.webhooks"):
        assert webhooks.deliver.apply(args=signed(target.url, event)).get() is None  # given up, not raised
    assert len(target.received) == 3  # the first try and two retries
    gave_up = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert len(gave_up) == 1 and "d-3" in gave_up[0].getMessage()
    assert "gave up after 3 attempt(s): answered 500" in gave_up[0].getMessage()


def test_a_refusal_that_retrying_cannot_fix_is_not_retried(receiver, settings, caplog):
    target = receiver(401)
    event = {"event": "job.status", "delivery": "d-4", "ts": "2026-12-03T10:00:00+00:00", "job": {"id": 7}}
    with caplog.at_level(logging.ERROR, logger="seam.webhooks"):
        webhooks.deliver.apply(args=signed(target.url, event))
    assert len(target.received) == 1 and "answered 401" in caplog.text


def test_the_backoff_doubles(settings, monkeypatch):
    settings.SEAM_WEBHOOK_RETRIES, settings.SEAM_WEBHOOK_BACKOFF_S = 3, 0.5
    delays = []

    def retry(countdown):  # what the worker would be told: send it again after `countdown` seconds
        delays.append(countdown)
        return RuntimeError("retried")

    monkeypatch.setattr(webhooks.deliver, "retry", retry)
    for attempt in range(4):
        webhooks.deliver.push_request(retries=attempt)
        try:
            webhooks.deliver.run("http://127.0.0.1:1/", "{}", webhooks.sign(b"{}", KEY), "d-5")
        except RuntimeError:
            pass
        finally:
            webhooks.deliver.pop_request()
    assert delays == [0.5, 1.0, 2.0]  # the fourth attempt is the last: given up, not retried


# --- from a committed change, through the real worker ---------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_status_change_reaches_the_receiver_from_the_real_worker_signed(celery_worker, operator, receiver, hooked):
    target = hooked(receiver())
    job = a_job(operator)
    lifecycle.cancel(operator, job)
    (post,) = target.wait_for(1)
    event = json.loads(post["body"])
    assert event["event"] == "job.status" and event["delivery"] == post["headers"]["X-Seam-Delivery"]
    assert {key: event["job"][key] for key in ("id", "kind", "status", "previous_status", "plan_hash", "proposer")} \
        == {"id": job.pk, "kind": "cut", "status": "cancelled", "previous_status": "proposed",
            "plan_hash": job.plan_hash, "proposer": "olga"}
    signature = post["headers"]["X-Seam-Signature"]
    assert signature == "sha256=" + hmac_hex(KEY, post["body"])  # verifies with the key...
    assert signature != "sha256=" + hmac_hex("another-key", post["body"])  # ...and with no other


@pytest.mark.django_db(transaction=True)
def test_the_real_worker_retries_a_receiver_that_answered_500(celery_worker, operator, receiver, hooked):
    target = hooked(receiver(500, 204))
    lifecycle.cancel(operator, a_job(operator))
    first, again = target.wait_for(2)  # the worker waits SEAM_WEBHOOK_BACKOFF_S (1 s) and sends it again
    assert first["body"] == again["body"]
    assert first["headers"]["X-Seam-Delivery"] == again["headers"]["X-Seam-Delivery"]


@pytest.mark.django_db(transaction=True)
def test_a_proposal_is_announced_with_no_previous_status(celery_worker, live_engine, operator, receiver, hooked):
    target = hooked(receiver())
    job = lifecycle.propose(operator, {"kind": "cut", "target": {"cut": other_cut(live_engine)}})
    event = json.loads(target.wait_for(1)[0]["body"])
    assert (event["job"]["id"], event["job"]["status"], event["job"]["previous_status"]) == (job.pk, "proposed", None)


# --- what is not sent, and what never fails a change ---------------------------------------------

@pytest.fixture
def sent(monkeypatch):
    """The deliveries announce hands to the broker, recorded instead of sent."""
    calls = []
    monkeypatch.setattr(webhooks.deliver, "apply_async", lambda args: calls.append(args))
    return calls


@pytest.mark.django_db(transaction=True)
def test_without_urls_nothing_is_sent(operator, sent, settings):
    settings.SEAM_WEBHOOK_URLS, settings.SEAM_WEBHOOK_KEY = [], KEY
    lifecycle.cancel(operator, a_job(operator))
    assert sent == []


@pytest.mark.django_db(transaction=True)
def test_without_a_key_nothing_is_sent_and_that_is_logged(operator, sent, settings, caplog):
    settings.SEAM_WEBHOOK_URLS, settings.SEAM_WEBHOOK_KEY = ["http://127.0.0.1:9/hook"], ""
    with caplog.at_level(logging.ERROR, logger="seam.webhooks"):
        lifecycle.cancel(operator, a_job(operator))
    assert sent == [] and "SEAM_WEBHOOK_KEY is not" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_one_delivery_per_url_each_with_its_own_id(operator, sent, settings):
    settings.SEAM_WEBHOOK_URLS = ["http://127.0.0.1:9/a", "ftp://example.invalid/b", "https://hooks.example.org/c"]
    settings.SEAM_WEBHOOK_KEY = KEY
    lifecycle.cancel(operator, a_job(operator))
    assert [args[0] for args in sent] == ["http://127.0.0.1:9/a", "https://hooks.example.org/c"]  # not ftp
    assert len({args[3] for args in sent}) == 2
    for _url, body, signature, delivery, _event in sent:
        assert webhooks.signature_matches(body.encode(), signature, KEY) and json.loads(body)["delivery"] == delivery


@pytest.mark.django_db(transaction=True)
def test_a_broker_that_refuses_the_task_does_not_fail_the_change(operator, settings, monkeypatch, caplog):
    settings.SEAM_WEBHOOK_URLS, settings.SEAM_WEBHOOK_KEY = ["http://127.0.0.1:9/hook"], KEY

    def broker_down(args):
        raise ConnectionError("the broker is down")

    monkeypatch.setattr(webhooks.deliver, "apply_async", broker_down)
    job = a_job(operator)
    with caplog.at_level(logging.ERROR, logger="seam.webhooks"):
        assert lifecycle.cancel(operator, job).status == "cancelled"
    job.refresh_from_db()
    assert job.status == "cancelled" and "could not send the webhooks" in caplog.text
