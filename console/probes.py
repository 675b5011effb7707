"""Health probes for load balancers, orchestrators and systemd: GET /healthz and GET /readyz, no login.

- /healthz (liveness): the process answers; nothing else is touched (no database, no Redis), so a restart is asked
  for only when this process itself is stuck. Always 200 {"status": "ok"}.
- /readyz (readiness): the console can do its work: the database answers a query, every Redis it uses (the
  channel layer's and the Celery broker's) answers PING, and the engine's /healthz says ok, asked through the
  console's one engine client (console/engine.py). 200 when all are ready; 503 naming each check that failed and
  why. The checks run at once, each bounded by SEAM_READYZ_TIMEOUT_S, so a dead Redis or engine costs the probe
  that long at most. Reasons carry no credentials (a password in a URL is masked) and no traceback.

ProbeMiddleware answers both before the rest of the middleware, so a probe passes where a browser would not: any
Host header (a load balancer probes by address, not by the public name in ALLOWED_HOSTS), plain HTTP where HTTPS is
enforced (the probe comes from inside), no session, CSRF token, login or lockout. It can do so because the answers
carry nothing a page or another host could use: no cookie, no link, no secret. They are plain Django views, not part
of the REST API, so the OpenAPI schema (which documents /api/ only) does not list them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from console.engine import EngineClient

__all__ = ["ProbeMiddleware", "liveness", "readiness"]

_CREDENTIALS_IN_URL = re.compile(r"(\w+://)[^/@\s]*@")
_REASON_CHARS = 300


class NotReady(Exception):
    """A dependency answered, and its answer says it cannot serve."""


def liveness() -> JsonResponse:
    return JsonResponse({"status": "ok"})


def readiness() -> JsonResponse:
    """Every check at once, each on a thread of its own, within the timeout; 503 naming the failed ones."""
    timeout = settings.SEAM_READYZ_TIMEOUT_S
    checks = {"database": _database, "redis": lambda: _redis(timeout), "engine": lambda: _engine(timeout)}
    pool = ThreadPoolExecutor(max_workers=len(checks), thread_name_prefix="readyz")
    started = time.monotonic()
    futures = {name: pool.submit(_timed, check) for name, check in checks.items()}
    wait(futures.values(), timeout=timeout + 0.5)  # each check's own timeouts end it first; this is the backstop
    pool.shutdown(wait=False, cancel_futures=True)  # a check still hanging must not hold the answer
    results = {}
    for name, future in futures.items():
        if not future.done():
            results[name] = {"ok": False, "error": f"no answer within {timeout:g} s"}
        elif (error := future.exception()) is not None:
            results[name] = {"ok": False, "error": _reason(error)}
        else:
            results[name] = {"ok": True, "ms": future.result()}
    failed = [name for name, result in results.items() if not result["ok"]]
    body = {"status": "not ready" if failed else "ready", "failed": failed, "checks": results,
            "ms": round((time.monotonic() - started) * 1000, 1)}
    return JsonResponse(body, status=503 if failed else 200)


PROBES: dict[str, Callable[[], JsonResponse]] = {"/healthz": liveness, "/readyz": readiness}


class ProbeMiddleware:
    """Answers /healthz and /readyz itself (see the module's docstring for why before the other middleware)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        probe = PROBES.get(request.path_info)
        if probe is None:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            response = JsonResponse({"error": f"{request.path_info} answers GET only"}, status=405)
            response["Allow"] = "GET, HEAD"
            return response
        response = probe()
        response["Cache-Control"] = "no-store"  # a cached "ready" would hide an outage
        return response


def _timed(check: Callable[[], None]) -> float:
    started = time.monotonic()
    check()
    return round((time.monotonic() - started) * 1000, 1)


def _database() -> None:
    # On the probe's own thread: its connection is that thread's, closed here, not left for a thread that is gone.
    # PostgreSQL's connect_timeout (console/settings.py) bounds a server that never answers.
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        connection.close()


def _redis(timeout: float) -> None:
    for role, url in _redis_urls():
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            client.ping()
        except redis.RedisError as error:
            raise NotReady(f"{role} at {_shown(url)}: {error}") from None
        finally:
            client.close()


def _redis_urls() -> list[tuple[str, str]]:
    """Each Redis the console uses, with what it is for; one URL used for both is checked once."""
    roles: dict[str, str] = {}  # url -> what it is for
    for host in settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]:
        address = host["address"] if isinstance(host, dict) else host
        roles[address if isinstance(address, str) else "redis://{}:{}".format(*address)] = "the channel layer's Redis"
    broker = settings.CELERY_BROKER_URL
    if broker.startswith(("redis://", "rediss://", "unix://")):  # the only broker Seam's deployments use
        roles[broker] = "the channel layer's Redis and the Celery broker" if broker in roles else "the Celery broker"
    return [(role, url) for url, role in roles.items()]


def _engine(timeout: float) -> None:
    with EngineClient(timeout_s=timeout) as client:
        health = client.health()
    if not health.ok:
        raise NotReady(f"the engine is {health.phase}: {health.reason}")


def _shown(url: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def _reason(error: BaseException) -> str:
    """One line that says what failed, with any credentials in a URL masked."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = text if isinstance(error, NotReady) else f"{type(error).__name__}: {text}"
    return _CREDENTIALS_IN_URL.sub(r"\1***@", text)[:_REASON_CHARS]
