"""The engine's apply gates without a live engine: the attestation check (engine/serve/access.py `attested`, over
contracts/attestation.py `verify_attestation`); the job ledger has its own tests (tests/engine/test_job_ledger.py).

The same gates are exercised end to end against a running engine in tests/security/test_engine_credentials.py;
these run in milliseconds, so a regression shows in the `-m "not slow"` loop.
"""

from __future__ import annotations

import pytest

from contracts.attestation import ATTESTATION_MAX_AGE_S, Attestation, AuditHead, sign_attestation
from engine.control.protocol import ApplyRefused
from engine.serve.access import Credentials, attested

KEY = "approval-key-for-tests"
CREDENTIALS = Credentials(control_token="control", approval_key=KEY)
PLAN_HASH = "ab" * 32
NOW = 1_700_000_000.0
HEAD = AuditHead("1a" * 32, 7, "2b" * 32)


def signed(plan_hash: str = PLAN_HASH, job_id: int = 42, approvers=("rita",), issued_at: float = NOW,
           key: str = KEY) -> dict:
    return sign_attestation(key, plan_hash, job_id, list(approvers), issued_at, HEAD)


def refusal(attestation, plan_hash: str = PLAN_HASH, now: float = NOW,
            credentials: Credentials = CREDENTIALS) -> ApplyRefused:
    with pytest.raises(ApplyRefused) as refused:
        attested(credentials, attestation, plan_hash, now)
    assert refused.value.status == 403
    return refused.value


# --- the attestation -------------------------------------------------------------------------------

def test_a_valid_attestation_names_its_job_and_approvers():
    assert attested(CREDENTIALS, signed(approvers=("rita", "ahmed")), PLAN_HASH, NOW + 60) == \
        Attestation(42, ("ahmed", "rita"), NOW, HEAD)


@pytest.mark.parametrize(("attestation", "plan_hash", "message"), [
    (signed(key="another-key"), PLAN_HASH, "signature does not match"),
    (signed(plan_hash="cd" * 32), PLAN_HASH, "signature does not match"),
    (signed() | {"job_id": 43}, PLAN_HASH, "signature does not match"),
    (signed() | {"approvers": ["mallory"]}, PLAN_HASH, "signature does not match"),
    (signed() | {"issued_at": NOW + 1}, PLAN_HASH, "signature does not match"),
    (signed() | {"signature": "0" * 64}, PLAN_HASH, "signature does not match"),
    (signed(), "cd" * 32, "signature does not match"),
], ids=["another key", "another plan", "another job", "other approvers", "another time", "no signature at all",
        "sent with another plan"])
def test_a_forged_or_misdirected_attestation_is_refused(attestation, plan_hash, message):
    """Guard: the HMAC check of verify_attestation: only the console's signature over this very plan, job,
    approvers and time lets a plan through."""
    assert message in str(refusal(attestation, plan_hash))


@pytest.mark.parametrize("issued_at", [NOW - ATTESTATION_MAX_AGE_S - 1, NOW + ATTESTATION_MAX_AGE_S + 1])
def test_an_attestation_outside_its_validity_is_refused(issued_at):
    """Guard: the age check of verify_attestation (an old attestation cannot be replayed later; a clock far ahead is
    refused too)."""
    assert "outside the" in str(refusal(signed(issued_at=issued_at)))


@pytest.mark.parametrize(("attestation", "message"), [
    (None, "attestation is missing"),
    ("job 42", "attestation is missing or not an object"),
    ({k: v for k, v in signed().items() if k != "signature"}, "missing signature"),
    (signed() | {"admin": True}, "unknown admin"),
    (signed() | {"job_id": True}, "attestation.job_id"),
    (signed() | {"job_id": 0}, "attestation.job_id"),
    (signed() | {"approvers": []}, "attestation.approvers"),
    (signed() | {"issued_at": "today"}, "attestation.issued_at"),
    (signed() | {"signature": 7}, "attestation.signature"),
])
def test_a_malformed_attestation_is_refused_naming_the_field(attestation, message):
    assert message in str(refusal(attestation))


def test_an_engine_without_an_approval_key_applies_nothing():
    """Guard: `attested` refuses every attestation, even a well-signed one, when the engine holds no key."""
    assert "SEAM_APPROVAL_KEY" in str(refusal(signed(), credentials=Credentials(control_token="control")))
