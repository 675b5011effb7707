"""Production settings (SEAM_DEBUG=0): `manage.py check --deploy` is clean, and a missing or weak secret key
stops the console before it serves anything. Each runs manage.py in a subprocess with a production env."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SEAM_") and k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def test_check_deploy_is_clean_under_production_settings():
    done = manage("check", "--deploy", "--fail-level", "WARNING",
                  SEAM_DEBUG="0", SEAM_SECRET_KEY=secrets.token_urlsafe(64), SEAM_AUDIT_KEY=secrets.token_urlsafe(48))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout
    assert "WARNING" not in done.stdout + done.stderr


def test_check_deploy_would_notice_a_plain_http_setup():
    """The clean result above is the settings' doing: turning the redirect off is reported."""
    done = manage("check", "--deploy", "--fail-level", "WARNING",
                  SEAM_DEBUG="0", SEAM_SECRET_KEY=secrets.token_urlsafe(64), SEAM_AUDIT_KEY=secrets.token_urlsafe(48),
                  SEAM_SSL_REDIRECT="0")
    assert done.returncode != 0 and "security.W008" in done.stdout + done.stderr


@pytest.mark.parametrize("key, said", [(None, "it is unset"), ("short-key", "it is 9 characters"),
                                       ("a" * 60, "random string")])
def test_production_refuses_a_missing_or_weak_secret_key(key, said):
    env = {"SEAM_DEBUG": "0"} | ({"SEAM_SECRET_KEY": key} if key is not None else {})
    done = manage("check", **env)
    assert done.returncode != 0
    assert "SEAM_SECRET_KEY must be set" in done.stderr and said in done.stderr


def test_production_cookies_and_transport_are_secure():
    probe = ("from django.conf import settings as s; print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
             "s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS > 0, s.SECURE_PROXY_SSL_HEADER, s.DEBUG)")
    done = manage("shell", "-c", probe, SEAM_DEBUG="0", SEAM_SECRET_KEY=secrets.token_urlsafe(64),
                  SEAM_AUDIT_KEY=secrets.token_urlsafe(48), SEAM_BEHIND_PROXY="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True True True True ('HTTP_X_FORWARDED_PROTO', 'https') False"
