"""SEAM_AUDIT_KEY: production refuses to start without a strong one; development derives one from SECRET_KEY.
Each runs manage.py in a subprocess with a controlled environment, as tests/console/security/test_deploy_settings
does."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = "from django.conf import settings as s; print(s.SEAM_AUDIT_KEY); print(s.SEAM_AUDIT_ANCHOR_PATH)"


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SEAM_") and k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("key", "said"), [(None, "it is unset"), ("short", "it is 5 characters"),
                                           ("a" * 40, "random string")])
def test_production_refuses_a_missing_or_weak_audit_key(key, said):
    env = {"SEAM_DEBUG": "0", "SEAM_SECRET_KEY": secrets.token_urlsafe(64)}
    done = manage("check", **env | ({"SEAM_AUDIT_KEY": key} if key is not None else {}))
    assert done.returncode != 0
    assert "SEAM_AUDIT_KEY must be set" in done.stderr and said in done.stderr


def test_production_takes_the_key_and_anchor_path_from_the_environment(tmp_path):
    key = secrets.token_urlsafe(48)
    done = manage("shell", "-c", PROBE, SEAM_DEBUG="0", SEAM_SECRET_KEY=secrets.token_urlsafe(64),
                  SEAM_AUDIT_KEY=key, SEAM_AUDIT_ANCHOR_PATH=str(tmp_path / "anchor.jsonl"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == [key, str(tmp_path / "anchor.jsonl")]


def test_development_derives_a_key_from_the_secret_key_and_anchors_in_the_var_folder(tmp_path):
    secret = secrets.token_urlsafe(64)
    done = manage("shell", "-c", PROBE, SEAM_SECRET_KEY=secret, SEAM_VAR_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    derived = hmac.new(secret.encode(), b"seam-audit-chain", hashlib.sha256).hexdigest()
    assert done.stdout.split()[-2:] == [derived, str(tmp_path / "audit-anchor.jsonl")]
    assert derived != secret


def test_a_process_that_records_no_audit_events_starts_without_the_key_and_cannot_key_an_event():
    """Pins SEAM_AUDIT_WRITER=0 (console/settings.py), what `make run` gives its beat and telemetry bridge (issue 30,
    item 8): production settings start without a key, and a key in the environment is not taken up either."""
    production = {"SEAM_DEBUG": "0", "SEAM_SECRET_KEY": secrets.token_urlsafe(64), "SEAM_AUDIT_WRITER": "0"}
    assert manage("check", **production).returncode == 0
    done = manage("shell", "-c", "from console.audit.chain import chain_key; chain_key()",
                  **production, SEAM_AUDIT_KEY=secrets.token_urlsafe(48))
    assert done.returncode != 0 and "settings.SEAM_AUDIT_KEY is empty" in done.stderr, done.stderr[-500:]
