"""`make run`'s secrets, made with no step for the user, and which process of the stack gets which.

The engine's control token and approval key are new on each run unless set; the Django secret key and the audit
chain's key are generated once into files only this user can read under the var folder and reused after, so logins
and the audit trail outlive a restart. Each process gets only the secrets it uses (`SECRETS_BY_PROCESS`): the
approval key only the worker, which signs approvals, and the engine, which checks them; the audit key only the
processes that record audit events (the console's web process and the worker), so a beat or a telemetry bridge that
is made to misbehave can neither sign an apply nor re-key the audit chain.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

from contracts.attestation import APPROVAL_KEY_ENV, CONTROL_TOKEN_ENV

__all__ = ["PERSISTENT_SECRETS", "SECRETS", "SECRETS_BY_PROCESS", "persistent_secret", "process_env",
           "stack_secrets"]

SECRET_KEY_ENV, AUDIT_KEY_ENV = "SEAM_SECRET_KEY", "SEAM_AUDIT_KEY"
# Secrets kept under the var folder: the session cookies and the keyed audit chain must verify after a restart.
PERSISTENT_SECRETS = {SECRET_KEY_ENV: "secret-key", AUDIT_KEY_ENV: "audit-key"}  # env name -> file
SECRETS = (CONTROL_TOKEN_ENV, APPROVAL_KEY_ENV, *PERSISTENT_SECRETS)
# Every console process needs the secret key (its settings refuse to start without one when DEBUG is off).
SECRETS_BY_PROCESS: dict[str, frozenset[str]] = {
    "engine": frozenset({CONTROL_TOKEN_ENV, APPROVAL_KEY_ENV}),  # checks the token and each job's attestation
    "worker": frozenset(SECRETS),  # calls the engine, signs attestations, records job events
    "web": frozenset({SECRET_KEY_ENV, AUDIT_KEY_ENV, CONTROL_TOKEN_ENV}),  # sessions, audit events, engine state
    "bridge": frozenset({SECRET_KEY_ENV}),  # forwards telemetry from Redis to the websockets
    "beat": frozenset({SECRET_KEY_ENV}),  # only sends periodic tasks to the worker
}


def persistent_secret(path: Path) -> str:
    """The secret in `path`: generated there on first use, readable by this user only, the same on every run."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:  # copied in or restored from a backup with looser permissions
            path.chmod(0o600)
        secret = path.read_text().strip()
        if not secret:
            sys.exit(f"{path} is empty: delete it to have a new secret generated (logins then start afresh, and "
                     "for the audit key, events recorded under the old one no longer verify)")
        return secret
    secret = secrets.token_urlsafe(64)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secret + "\n")
    return secret


def stack_secrets(var: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """The stack's secrets, and the audit anchor's path; a value already set in `environ` is kept.

    The control token and approval key are new on each run: only this run's engine and console need them, and a
    leaked one dies with the stack."""
    values = {name: environ.get(name) or secrets.token_urlsafe(32) for name in (CONTROL_TOKEN_ENV, APPROVAL_KEY_ENV)}
    for name, filename in PERSISTENT_SECRETS.items():
        values[name] = environ.get(name) or persistent_secret(var / filename)
    values["SEAM_AUDIT_ANCHOR_PATH"] = environ.get("SEAM_AUDIT_ANCHOR_PATH") or str(var / "audit-anchor.jsonl")
    return values


def process_env(process: str, environ: Mapping[str, str], stack: Mapping[str, str]) -> dict[str, str]:
    """The environment of one process of the stack: `environ` with every secret taken out, then the secrets of
    `stack` that `process` uses put back, and what is not secret in `stack` as it is. A console process not given
    the audit key is told it records no audit events (SEAM_AUDIT_WRITER=0), so its settings ask for no key."""
    wanted = SECRETS_BY_PROCESS[process]
    env = {name: value for name, value in environ.items() if name not in SECRETS}
    env.update({name: value for name, value in stack.items() if name not in SECRETS or name in wanted})
    if AUDIT_KEY_ENV not in wanted:
        env["SEAM_AUDIT_WRITER"] = "0"
    return env
