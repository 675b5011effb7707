"""Signed webhooks on job status changes (docs/console.md, "Webhooks").

Once a job's status change has committed (every lifecycle transition, and a proposal's creation), `announce` hands one
Celery task per URL of SEAM_WEBHOOK_URLS to the broker; the task POSTs

    {"event": "job.status", "delivery": <uuid>, "ts": <ISO 8601>,
     "job": {id, kind, status, previous_status, plan_hash, target, incumbent_fingerprint, proposer, not_before,
             error, engine_operation_id, speed_verdict, outcome, updated}}

with `X-Seam-Signature: sha256=<hex HMAC-SHA256 of the exact body under SEAM_WEBHOOK_KEY>`, `X-Seam-Delivery` and
`X-Seam-Event`. When a succeeded job's measured speedup misses its prediction (console.jobs.verdicts),
`announce_missed_prediction` sends `{"event": "job.missed_prediction", ..., "job": {...},
"speedup": {predicted, measured, noise_floor, error, missed}}` the same way. When the engine restarted under a job's
apply and came back on a layout the job did not lead to (console.jobs.layout_watch), `announce_restart_mid_apply`
sends `{"event": "engine.restarted_mid_apply", ..., "job": {...}, "engine": {url, before, after, boot_id_before,
boot_id_after}}`. Two events concern the engine alone, with no job: the layout watch's `engine.unexplained_change`
(`"engine": {url, before, after, observation, known_since}`: a layout change no job of the console caused) and the
health watch's `engine.health` (`"engine": {url, before, after}`, each `{status, reason}` with status `ok`,
`unhealthy` or `unreachable`, before null at first sight: console.jobs.health_watch).
Every payload also carries `"audit_head": {trail, seq, hash}`, the audit trail's newest event when it was sent, so a
receiver witnesses the trail too: a later payload with a lower seq of the same trail means the console's database
went back (docs/console.md, "Trust model").
The body is made and signed once, where the change was made, so every retry sends the same bytes. A failed POST
(no answer, 5xx, 408, 425, 429) is tried again after SEAM_WEBHOOK_BACKOFF_S, doubling, at most SEAM_WEBHOOK_RETRIES
times; the last failure is logged. Nothing here can block or fail the change: it has committed already, and every
error is logged, not raised. Without URLs nothing is sent; with URLs but no key nothing is sent either (a receiver
could not tell our events from anyone's) and that is logged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import uuid
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from console.audit.services import audit_head
from console.jobs.models import Job
from solvers.verdict import SpeedCheck

__all__ = ["ENGINE_HEALTH", "EVENT", "MISSED_PREDICTION", "RESTARTED_MID_APPLY", "UNEXPLAINED_CHANGE",
           "DeliveryFailed", "announce", "announce_engine_health", "announce_missed_prediction",
           "announce_restart_mid_apply", "announce_unexplained_change", "deliver", "job_event", "post", "sign",
           "signature_matches"]

log = logging.getLogger("seam.webhooks")

EVENT = "job.status"
MISSED_PREDICTION = "job.missed_prediction"
RESTARTED_MID_APPLY = "engine.restarted_mid_apply"
UNEXPLAINED_CHANGE = "engine.unexplained_change"
ENGINE_HEALTH = "engine.health"
SIGNATURE_HEADER, DELIVERY_HEADER = "X-Seam-Signature", "X-Seam-Delivery"
RETRY_STATUSES = frozenset({408, 425, 429})


class DeliveryFailed(Exception):
    """A POST the receiver did not accept; `retryable` when trying again may help (no answer, 5xx, 408/425/429)."""

    def __init__(self, message: str, retryable: bool):
        super().__init__(message)
        self.retryable = retryable


def sign(body: bytes, key: str) -> str:
    """The X-Seam-Signature value of `body`: sha256=<hex HMAC-SHA256(key, body)>."""
    return "sha256=" + hmac.new(key.encode(), body, hashlib.sha256).hexdigest()


def signature_matches(body: bytes, header: str, key: str) -> bool:
    """What a receiver checks, in constant time (the recipe in docs/console.md does the same)."""
    return hmac.compare_digest(sign(body, key), header or "")


def job_event(job: Job, previous_status: str | None, delivery: str, event: str = EVENT) -> dict:
    return {"event": event, "delivery": delivery, "ts": timezone.now().isoformat(), "job": {
        "id": job.pk, "kind": job.kind, "status": job.status, "previous_status": previous_status,
        "plan_hash": job.plan_hash, "target": job.target, "incumbent_fingerprint": job.incumbent_fingerprint,
        "proposer": job.proposer_name, "not_before": job.not_before.isoformat() if job.not_before else None,
        "error": job.error, "engine_operation_id": job.engine_operation_id, "speed_verdict": job.speed_verdict,
        "outcome": job.outcome, "updated": job.updated.isoformat() if job.updated else None}}


def _urls() -> list[str]:
    urls = []
    for url in settings.SEAM_WEBHOOK_URLS:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.netloc:
            urls.append(url)
        else:
            log.error("SEAM_WEBHOOK_URLS: %r is not an http(s) URL; nothing is sent to it", url[:200])
    return urls


def announce(job: Job, previous_status: str | None) -> None:
    """Send the job's (committed) status change to every webhook URL; call it on commit. Never raises."""
    _send(EVENT, lambda delivery: job_event(job, previous_status, delivery), f"job {job.pk}'s change to {job.status}")


def announce_missed_prediction(job: Job, check: SpeedCheck) -> None:
    """Send `job.missed_prediction` for a succeeded job whose measured speedup missed its prediction (the verdict
    has committed); call it on commit. Never raises."""
    _send(MISSED_PREDICTION, lambda delivery: {
        **job_event(job, None, delivery, MISSED_PREDICTION), "speedup": check.to_dict()},
        f"job {job.pk}'s missed prediction")


def announce_restart_mid_apply(job: Job, engine: dict) -> None:
    """Send `engine.restarted_mid_apply` for a job whose engine restarted under its apply and came back on a layout
    the job did not lead to (`engine`: {url, before, after, boot_id_before, boot_id_after}); call it on commit.
    Never raises."""
    _send(RESTARTED_MID_APPLY, lambda delivery: {
        **job_event(job, None, delivery, RESTARTED_MID_APPLY), "engine": engine},
        f"job {job.pk}'s engine restart mid-apply")


def announce_unexplained_change(engine: dict) -> None:
    """Send `engine.unexplained_change` for a layout change no job caused (`engine`: {url, before, after,
    observation, known_since}); call it on commit. Never raises."""
    _send(UNEXPLAINED_CHANGE, lambda delivery: _engine_event(UNEXPLAINED_CHANGE, delivery, engine),
          f"the unexplained layout change of {engine.get('url')}")


def announce_engine_health(engine: dict) -> None:
    """Send `engine.health` for a change of the engine's health (`engine`: {url, before, after}); call it on
    commit. Never raises."""
    _send(ENGINE_HEALTH, lambda delivery: _engine_event(ENGINE_HEALTH, delivery, engine),
          f"the health change of {engine.get('url')}")


def _engine_event(event: str, delivery: str, engine: dict) -> dict:
    return {"event": event, "delivery": delivery, "ts": timezone.now().isoformat(), "engine": engine}


def _send(event: str, body_of: Callable[[str], dict], what: str) -> None:
    if not settings.SEAM_WEBHOOK_URLS:
        return
    try:
        key = settings.SEAM_WEBHOOK_KEY
        if not key:
            log.error("SEAM_WEBHOOK_URLS is set but SEAM_WEBHOOK_KEY is not: %s is not sent "
                      "(receivers could not verify it)", what)
            return
        head = audit_head().to_dict()  # the change's own event has committed: the head includes it
        for url in _urls():
            delivery = str(uuid.uuid4())
            body = json.dumps({**body_of(delivery), "audit_head": head}, sort_keys=True, separators=(",", ":"))
            deliver.apply_async(args=(url, body, sign(body.encode(), key), delivery, event))
    except Exception:  # the change has committed; a lost webhook must not undo or fail it
        log.exception("could not send the webhooks of %s", what)


def post(url: str, body: str, signature: str, delivery: str, event: str = EVENT) -> int:
    """POST one signed body; its HTTP status when the receiver accepted it (2xx), else DeliveryFailed."""
    headers = {"Content-Type": "application/json", SIGNATURE_HEADER: signature, DELIVERY_HEADER: delivery,
               "X-Seam-Event": event, "User-Agent": "seam-console-webhook"}
    try:
        response = httpx.post(url, content=body.encode(), headers=headers, follow_redirects=False,
                              timeout=float(settings.SEAM_WEBHOOK_TIMEOUT_S))
    except httpx.HTTPError as error:
        raise DeliveryFailed(f"no answer ({type(error).__name__}: {error})", retryable=True) from error
    if not 200 <= response.status_code < 300:
        retryable = response.status_code >= 500 or response.status_code in RETRY_STATUSES
        raise DeliveryFailed(f"answered {response.status_code}", retryable=retryable)
    return response.status_code


# max_retries=None: the bound is SEAM_WEBHOOK_RETRIES, read when the task runs (below).
@shared_task(name="console.jobs.webhooks.deliver", bind=True, ignore_result=True, max_retries=None)
def deliver(self, url: str, body: str, signature: str, delivery: str, event: str = EVENT) -> int | None:
    """Deliver one webhook, retried with exponential backoff; the final failure is logged, never raised."""
    attempt = self.request.retries + 1
    try:
        return post(url, body, signature, delivery, event)
    except DeliveryFailed as failure:
        retries = max(0, int(settings.SEAM_WEBHOOK_RETRIES))
        if failure.retryable and attempt <= retries:
            delay = float(settings.SEAM_WEBHOOK_BACKOFF_S) * 2 ** (attempt - 1)
            log.warning("webhook %s to %s: %s; trying again in %.1f s", delivery, url, failure, delay)
            raise self.retry(countdown=delay) from failure
        log.error("webhook %s to %s: gave up after %d attempt(s): %s", delivery, url, attempt, failure)
        return None
