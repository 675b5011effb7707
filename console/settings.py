"""Console settings, read from the environment with local defaults (SQLite, local Redis)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import dj_database_url
import plotly

from console.private_files import use_private_umask
from console.stack import stack_names
from contracts.attestation import APPROVAL_KEY_ENV, CONTROL_TOKEN_ENV

BASE_DIR = Path(__file__).resolve().parent.parent
# Every console process (manage.py, Celery, daphne, WSGI) reads these settings before it creates a file: the
# database, beat's schedule and pidfile and the audit anchor are then readable by this user only.
use_private_umask()


def _env_bool(name: str, default: bool) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


DEBUG = _env_bool("SEAM_DEBUG", True)
# A development key only: production settings require SEAM_SECRET_KEY.
SECRET_KEY = os.environ.get("SEAM_SECRET_KEY", "seam-development-key-not-for-production")
ALLOWED_HOSTS = [h for h in os.environ.get("SEAM_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Redoc's bundle as a static file, for /api/docs/ (no CDN)
    "axes",
    "channels",
    "console.audit",
    "console.accounts",
    "console.jobs",
    "console.calibration",
    "console.api",
    "console.live",
    "console.ui",
]

MIDDLEWARE = [
    "console.audit.request_id.RequestIdMiddleware",
    # /healthz and /readyz, answered before the host check, the HTTPS redirect, sessions and logins (console.probes).
    "console.probes.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a login that axes flagged as locked out into its lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "console.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.ui.context.pending_review",
            ]
        },
    }
]
WSGI_APPLICATION = "console.wsgi.application"
ASGI_APPLICATION = "console.asgi.application"

DATABASES = {
    "default": dj_database_url.parse(os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"))
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes write one SQLite file (the console, the worker, beat's tasks): WAL lets readers go on
    # beside a writer, a writer waits up to the timeout for another instead of failing with "database is locked",
    # and IMMEDIATE takes the write lock when a transaction begins, so two transactions that read and then write
    # never deadlock on upgrading their locks (SQLite fails that at once, whatever the timeout).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        timeout=float(os.environ.get("SEAM_SQLITE_TIMEOUT_S", "20")), transaction_mode="IMMEDIATE",
        init_command="PRAGMA journal_mode=WAL;")
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # libpq waits for a server that never answers as long as TCP does (minutes): fail a connection in seconds, so a
    # request, a task and the /readyz probe report the outage instead of hanging on it. A URL's own value wins.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
        "connect_timeout", int(os.environ.get("SEAM_DB_CONNECT_TIMEOUT_S", "5")))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
ENGINE_URL = os.environ.get("SEAM_ENGINE_URL", "http://127.0.0.1:8100")
# The longest GET /readyz waits for any one of its checks (database, Redis, engine; console.probes).
SEAM_READYZ_TIMEOUT_S = float(os.environ.get("SEAM_READYZ_TIMEOUT_S", "3"))
# The model and rig the engine runs, for the planner's frontier page and API.
SEAM_RIG = os.environ.get("SEAM_RIG", "cpu-demo")
SEAM_MODEL = os.environ.get("SEAM_MODEL", "demo-hybrid-16")
# The stack key (console/stack.py): with SEAM_STACK set, every Redis name below (telemetry channel, Celery queue and
# exchanges, Channels prefix) starts with seam:<key>:, so two stacks on one Redis stay apart.
try:
    STACK_NAMES = stack_names(os.environ)
except ValueError as error:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(str(error)) from None
TELEMETRY_CHANNEL = STACK_NAMES.telemetry_channel

# Review gate (docs/architecture.md §4): how many reviewer approvals a job needs, and how long one stays valid.
SEAM_REQUIRED_APPROVALS = int(os.environ.get("SEAM_REQUIRED_APPROVALS", "1"))
SEAM_APPROVAL_TTL_S = int(os.environ.get("SEAM_APPROVAL_TTL_S", "3600"))

# The engine's credentials (contracts/attestation.py; docs/console.md, "Trust model"): the control token every call to
# the engine's /control/* carries, and the key the worker signs each job's approval attestation with, without which
# the engine applies nothing. `make run` generates both per run and hands them to the engine as well.
SEAM_ENGINE_TOKEN = os.environ.get(CONTROL_TOKEN_ENV, "")
SEAM_APPROVAL_KEY = os.environ.get(APPROVAL_KEY_ENV, "")
# How often beat has the console compare the engine's layout with the one it last knew (console.jobs.layout_watch).
SEAM_LAYOUT_WATCH_S = float(os.environ.get("SEAM_LAYOUT_WATCH_S", "30"))
# How often beat records what the engine measured of its running layout (console.calibration.recording): at most one
# row per SEAM_MEASURE_S, and only when its window has new decode steps.
SEAM_MEASURE_S = float(os.environ.get("SEAM_MEASURE_S", "30"))
# How often beat queues approved jobs whose not_before has come (console.jobs.schedule).
SEAM_SCHEDULE_POLL_S = float(os.environ.get("SEAM_SCHEDULE_POLL_S", "15"))

# Signed webhooks on job status changes (console.jobs.webhooks; docs/console.md, "Webhooks"): comma-separated URLs,
# the HMAC-SHA256 key receivers verify with (nothing is sent without one), and how hard a delivery is tried.
SEAM_WEBHOOK_URLS = [url.strip() for url in os.environ.get("SEAM_WEBHOOK_URLS", "").split(",") if url.strip()]
SEAM_WEBHOOK_KEY = os.environ.get("SEAM_WEBHOOK_KEY", "")
SEAM_WEBHOOK_RETRIES = int(os.environ.get("SEAM_WEBHOOK_RETRIES", "5"))
SEAM_WEBHOOK_BACKOFF_S = float(os.environ.get("SEAM_WEBHOOK_BACKOFF_S", "1"))
SEAM_WEBHOOK_TIMEOUT_S = float(os.environ.get("SEAM_WEBHOOK_TIMEOUT_S", "5"))

# Logins and tokens (console.accounts; docs/console.md, "Logins and tokens"). django-axes locks a username + client
# address after SEAM_LOGIN_FAILURE_LIMIT failures, on the login pages and the token API alike, for
# SEAM_LOGIN_COOLOFF_S after the last counted failure; refusals while locked are not counted, so they do not
# stretch the lock. A successful login clears the count. Attempts live in the database (axes' AccessAttempt).
SEAM_LOGIN_FAILURE_LIMIT = int(os.environ.get("SEAM_LOGIN_FAILURE_LIMIT", "5"))
SEAM_LOGIN_COOLOFF_S = int(os.environ.get("SEAM_LOGIN_COOLOFF_S", "900"))
SEAM_TOKEN_TTL_S = int(os.environ.get("SEAM_TOKEN_TTL_S", str(24 * 3600)))
SEAM_TOKEN_RATE = os.environ.get("SEAM_TOKEN_RATE", "20/min")
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = SEAM_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = dt.timedelta(seconds=SEAM_LOGIN_COOLOFF_S)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# The audit trail records refused logins; axes' own log of every successful login would be a second, unpruned one.
AXES_DISABLE_ACCESS_LOG = True
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True  # a worker killed mid-job leaves the message to be redelivered
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = STACK_NAMES.task_queue
# Per stack too, so one stack's remote control and events (and its worker's node name) never meet another's.
CELERY_CONTROL_EXCHANGE = STACK_NAMES.control_exchange
CELERY_EVENT_EXCHANGE = STACK_NAMES.event_exchange
# The reconciler settles jobs a dead worker left running, from the engine's own operation record.
# The layout watch notices (audits, shows on the dashboard) a layout change no job of the console caused.
# The measurement records what the engine measured of its running layout (console.calibration).
CELERY_BEAT_SCHEDULE = {
    "seam-reconcile-jobs": {"task": "console.jobs.tasks.reconcile_jobs", "schedule": 60.0},
    "seam-watch-engine-layout": {"task": "console.jobs.tasks.watch_engine_layout", "schedule": SEAM_LAYOUT_WATCH_S},
    "seam-measure-engine-layout": {"task": "console.calibration.tasks.measure_engine_layout",
                                   "schedule": SEAM_MEASURE_S},
    "seam-queue-scheduled-jobs": {"task": "console.jobs.tasks.queue_scheduled_jobs", "schedule": SEAM_SCHEDULE_POLL_S},
}

# Two redis-py defaults that close browsers' sockets with 1011 (found by benchmarks/console_load.py):
# a pool fails the command past 100 connections (100 browsers subscribing at once), and a 5 s socket timeout
# races channels-redis' 5 s blocking pop, so a socket that hears nothing for 5 s dies. Raise the cap, and
# keep the timeout above the pop (a Redis that stops answering is still noticed).
SEAM_CHANNEL_LAYER_CONNECTIONS = int(os.environ.get("SEAM_CHANNEL_LAYER_CONNECTIONS", "1000"))
CHANNEL_LAYERS = {
    "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [
        {"address": REDIS_URL, "max_connections": SEAM_CHANNEL_LAYER_CONNECTIONS, "socket_timeout": 15}],
        "prefix": STACK_NAMES.channel_layer_prefix}},
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Tokens first, so a refused request is a 401 with `WWW-Authenticate: Token` (an expired token says so).
        "console.accounts.authentication.ExpiringTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Per client address, on the token endpoint only (ScopedRateThrottle): defence in depth under the lockout.
    "DEFAULT_THROTTLE_RATES": {"auth-token": SEAM_TOKEN_RATE},
}
SPECTACULAR_SETTINGS = {"TITLE": "Seam console API", "VERSION": "1.0.0"}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_TZ = True

STATIC_URL = "static/"
# plotly.js comes from the plotly package itself (no CDN), served as static/plotly/plotly.min.js.
STATICFILES_DIRS = [BASE_DIR / "static", ("plotly", Path(plotly.__file__).resolve().parent / "package_data")]
# collectstatic fills it for production; elsewhere it is named only once it exists, so whitenoise does not
# warn about a folder that nobody meant to create.
_collected_static = Path(os.environ.get("SEAM_STATIC_ROOT", BASE_DIR / "staticfiles"))
STATIC_ROOT = _collected_static if not DEBUG or _collected_static.is_dir() else None
# Without collected files (development, tests) whitenoise serves straight from the finders.
WHITENOISE_USE_FINDERS = True
# Files the console's storages write (collected static files) take the private umask's mode, not Django's 0644.
FILE_UPLOAD_PERMISSIONS = None

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

# --- Production (SEAM_DEBUG=0): what `manage.py check --deploy` asks for -----------------------------------
# HTTPS only: secure cookies, HSTS and a redirect to https. Behind a TLS-terminating proxy set
# SEAM_BEHIND_PROXY=1 so Django trusts its X-Forwarded-Proto header (only if the proxy always sets it);
# SEAM_SSL_REDIRECT=0 leaves redirecting to the proxy. Browsers posting forms through the proxy's public
# name need it in SEAM_CSRF_TRUSTED_ORIGINS (e.g. https://seam.example.org).
# SEAM_LOOPBACK_HTTP=1 is `make run`'s: DEBUG off, served over plain HTTP on 127.0.0.1 only, where no TLS is and
# none can be redirected to, so cookies are not Secure-only and there is no redirect and no HSTS.
MIN_SECRET_KEY_LENGTH = 50

if not DEBUG:
    SECRET_KEY = os.environ.get("SEAM_SECRET_KEY", "")
    if len(SECRET_KEY) < MIN_SECRET_KEY_LENGTH or len(set(SECRET_KEY)) < 5:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"SEAM_SECRET_KEY must be set to a random string of at least {MIN_SECRET_KEY_LENGTH} characters when "
            f"SEAM_DEBUG=0 (it is {'unset' if not SECRET_KEY else f'{len(SECRET_KEY)} characters'}); e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(64))'")
    _loopback_http = _env_bool("SEAM_LOOPBACK_HTTP", False)
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = not _loopback_http
    SESSION_COOKIE_HTTPONLY = True
    SECURE_SSL_REDIRECT = not _loopback_http and _env_bool("SEAM_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = 0 if _loopback_http else int(os.environ.get("SEAM_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("SEAM_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = _env_bool("SEAM_HSTS_PRELOAD", True)
    if _env_bool("SEAM_BEHIND_PROXY", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("SEAM_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

# --- Audit trail (console.audit; docs/console.md, "Check the audit trail") ---------------------------------------
# SEAM_AUDIT_KEY keys the hash chain; it must live outside the database, or whoever rewrites a row re-hashes the rest.
# Production requires it (after SECRET_KEY's check, so a bare production env names SECRET_KEY first); development
# derives one from SECRET_KEY, domain-separated so the chain never shares a key with sessions and signing.
# SEAM_AUDIT_ANCHOR_PATH is the append-only file the head (seq, hash, MAC) is written to after each append, so deleting
# the newest events is caught; by default it sits in the var folder `make run` uses (SEAM_VAR_DIR), so a stack with a
# folder of its own has an anchor of its own.
# A process that records no audit events (`make run`'s beat and telemetry bridge) runs with SEAM_AUDIT_WRITER=0 and
# is not given the key: none is required or derived there, and an event it tried to record would fail to be keyed.
MIN_AUDIT_KEY_LENGTH = 32
SEAM_AUDIT_WRITER = _env_bool("SEAM_AUDIT_WRITER", True)
SEAM_AUDIT_KEY = os.environ.get("SEAM_AUDIT_KEY", "") if SEAM_AUDIT_WRITER else ""
if SEAM_AUDIT_WRITER and not DEBUG and (len(SEAM_AUDIT_KEY) < MIN_AUDIT_KEY_LENGTH or len(set(SEAM_AUDIT_KEY)) < 5):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"SEAM_AUDIT_KEY must be set to a random string of at least {MIN_AUDIT_KEY_LENGTH} characters when "
        f"SEAM_DEBUG=0 (it is {'unset' if not SEAM_AUDIT_KEY else f'{len(SEAM_AUDIT_KEY)} characters'}); it keys the "
        "audit hash chain, so keep it out of the database and keep it stable (events recorded under another key fail "
        "verify); e.g. python -c 'import secrets; print(secrets.token_urlsafe(48))'")
if SEAM_AUDIT_WRITER and not SEAM_AUDIT_KEY:
    import hashlib
    import hmac

    SEAM_AUDIT_KEY = hmac.new(SECRET_KEY.encode(), b"seam-audit-chain", hashlib.sha256).hexdigest()
SEAM_AUDIT_ANCHOR_PATH = Path(os.environ.get("SEAM_AUDIT_ANCHOR_PATH")
                              or Path(os.environ.get("SEAM_VAR_DIR", BASE_DIR / "var")) / "audit-anchor.jsonl")
