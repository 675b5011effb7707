"""`make run`'s secrets (launch/stack_secrets.py): engine credentials new on each run, the Django and audit keys
generated once into files only their owner can read, anything already set in the environment kept."""

from __future__ import annotations

import stat

from contracts.attestation import APPROVAL_KEY_ENV, CONTROL_TOKEN_ENV
from launch.stack_secrets import stack_secrets

GENERATED_PER_RUN = (CONTROL_TOKEN_ENV, APPROVAL_KEY_ENV)
KEPT_IN_FILES = {"SEAM_SECRET_KEY": "secret-key", "SEAM_AUDIT_KEY": "audit-key"}


def test_engine_credentials_are_new_on_each_run(tmp_path):
    first, second = stack_secrets(tmp_path, {}), stack_secrets(tmp_path, {})
    for name in GENERATED_PER_RUN:
        assert len(first[name]) >= 40 and first[name] != second[name]
    assert first[CONTROL_TOKEN_ENV] != first[APPROVAL_KEY_ENV]


def test_the_django_and_audit_keys_are_generated_once_into_files_only_their_owner_reads(tmp_path):
    first = stack_secrets(tmp_path, {})
    for name, filename in KEPT_IN_FILES.items():
        path = tmp_path / filename
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text().strip() == first[name] and len(first[name]) >= 50  # settings' production minimum
    assert first["SEAM_SECRET_KEY"] != first["SEAM_AUDIT_KEY"]
    again = stack_secrets(tmp_path, {})
    assert {name: again[name] for name in KEPT_IN_FILES} == {name: first[name] for name in KEPT_IN_FILES}
    assert first["SEAM_AUDIT_ANCHOR_PATH"] == str(tmp_path / "audit-anchor.jsonl")


def test_a_key_file_with_loose_permissions_is_tightened(tmp_path):
    (tmp_path / "audit-key").write_text("restored-from-a-backup\n")
    (tmp_path / "audit-key").chmod(0o644)
    assert stack_secrets(tmp_path, {})["SEAM_AUDIT_KEY"] == "restored-from-a-backup"
    assert stat.S_IMODE((tmp_path / "audit-key").stat().st_mode) == 0o600


def test_values_set_in_the_environment_are_kept_and_write_no_files(tmp_path):
    environ = {CONTROL_TOKEN_ENV: "t", APPROVAL_KEY_ENV: "k", "SEAM_SECRET_KEY": "s", "SEAM_AUDIT_KEY": "a",
               "SEAM_AUDIT_ANCHOR_PATH": "/elsewhere/anchor.jsonl"}
    assert stack_secrets(tmp_path, environ) == environ
    assert list(tmp_path.iterdir()) == []
