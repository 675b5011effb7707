"""The credentials console and engine share, and the approval attestation the engine checks before it applies.

Two secrets, each handed to the processes that need it through the environment (`make run` generates both):

- the **control token** (`SEAM_ENGINE_TOKEN`): every call to the engine's /control/* sends
  `Authorization: Bearer <token>`; without it the engine answers 401.
- the **approval key** (`SEAM_APPROVAL_KEY`): the console signs, for each job it executes, an attestation
  `{job_id, approvers, issued_at, audit_head, signature}` where `signature = HMAC-SHA256(key, canonical JSON of
  {plan_hash, job_id, approvers, issued_at, audit_head})`. The engine applies a plan only with a valid attestation
  for its plan_hash, so holding the control token alone is not enough to change the layout: a change needs a
  job that passed the review gate.
- the attestation's `audit_head` `{trail, seq, hash}` is the console's newest audit event when it signed: the engine
  keeps the newest head each trail's attestations carried (engine/control/audit_witness.py), outside the console's
  database, so a database restored to an older copy is refused and reported (docs/console.md, "Trust model").

The optional **API key** (`SEAM_API_KEY`) guards the engine's OpenAI-compatible /v1/*, as vLLM's --api-key does.
This module is the one owner of these names and of the attestation's shape; both sides import it. Every refusal
is a ContractError naming the field.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contracts.canonical import canonical_json
from contracts.errors import ContractError

__all__ = ["API_KEY_ENV", "APPROVAL_KEY_ENV", "ATTESTATION_MAX_AGE_S", "CONTROL_TOKEN_ENV", "Attestation", "AuditHead",
           "bearer_token", "sign_attestation", "verify_attestation"]

CONTROL_TOKEN_ENV = "SEAM_ENGINE_TOKEN"
APPROVAL_KEY_ENV = "SEAM_APPROVAL_KEY"
API_KEY_ENV = "SEAM_API_KEY"
# An attestation is signed when the worker executes the job, seconds before it is sent; a day's slack covers any
# clock skew between console and engine hosts while keeping an old one from being replayed later.
ATTESTATION_MAX_AGE_S = 24 * 3600.0
_FIELDS = ("job_id", "approvers", "issued_at", "audit_head", "signature")
_HEAD_FIELDS = ("trail", "seq", "hash")
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class AuditHead:
    """The newest event of a console's audit trail: `trail` is the hash of the trail's first event (which console
    database it is; the all-zero genesis value while the trail is empty), `seq` and `hash` its newest event's."""

    trail: str
    seq: int
    hash: str

    def to_dict(self) -> dict[str, Any]:
        return {"trail": self.trail, "seq": self.seq, "hash": self.hash}

    @classmethod
    def from_dict(cls, data: Any, where: str = "audit_head") -> AuditHead:
        """The head in `data`; ContractError naming the field otherwise."""
        if not isinstance(data, dict) or set(data) != set(_HEAD_FIELDS):
            raise ContractError(f"{where}: expected exactly {{{', '.join(_HEAD_FIELDS)}}}, the console's newest audit "
                              "event")
        trail, seq, hash_ = data["trail"], data["seq"], data["hash"]
        if type(seq) is not int or seq < 0:
            raise ContractError(f"{where}.seq: expected a non-negative integer")
        for name, value in (("trail", trail), ("hash", hash_)):
            if not isinstance(value, str) or not _HEX64.fullmatch(value):
                raise ContractError(f"{where}.{name}: expected 64 lowercase hex digits")
        return cls(trail, seq, hash_)


@dataclass(frozen=True)
class Attestation:
    """A verified attestation: which job's review let this plan through, who approved it, and the console's audit
    head when it signed."""

    job_id: int
    approvers: tuple[str, ...]
    issued_at: float
    audit_head: AuditHead

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "approvers": list(self.approvers), "issued_at": self.issued_at,
                "audit_head": self.audit_head.to_dict()}


def bearer_token(secret: str) -> dict[str, str]:
    """The header a client sends to prove it holds `secret`."""
    return {"Authorization": f"Bearer {secret}"}


def _signature(key: str, plan_hash: str, job_id: int, approvers: Sequence[str], issued_at: float,
               audit_head: AuditHead) -> str:
    message = canonical_json({"plan_hash": plan_hash, "job_id": job_id, "approvers": list(approvers),
                              "issued_at": issued_at, "audit_head": audit_head.to_dict()})
    return hmac.new(key.encode("utf-8"), message.encode("ascii"), hashlib.sha256).hexdigest()


def sign_attestation(key: str, plan_hash: str, job_id: int, approvers: Sequence[str], issued_at: float,
                     audit_head: AuditHead) -> dict:
    """The attestation the console sends beside a reviewed plan:
    `{job_id, approvers, issued_at, audit_head, signature}`."""
    if not key:
        raise ContractError(f"no approval key to sign with: set {APPROVAL_KEY_ENV}")
    names = sorted(set(approvers))
    if not names:
        raise ContractError("an attestation needs at least one approver")
    return {"job_id": job_id, "approvers": names, "issued_at": float(issued_at), "audit_head": audit_head.to_dict(),
            "signature": _signature(key, plan_hash, job_id, names, float(issued_at), audit_head)}


def verify_attestation(key: str, attestation: Any, plan_hash: str, now: float,
                       max_age_s: float = ATTESTATION_MAX_AGE_S) -> Attestation:
    """The attestation, verified for `plan_hash`; ContractError naming what is wrong otherwise."""
    if not isinstance(attestation, dict):
        raise ContractError("attestation is missing or not an object: a plan is applied only with the console's "
                          "attestation of its review ({job_id, approvers, issued_at, audit_head, signature})")
    unknown = sorted(set(attestation) - set(_FIELDS))
    missing = [name for name in _FIELDS if name not in attestation]
    if unknown or missing:
        raise ContractError(f"attestation: expected exactly {{{', '.join(_FIELDS)}}} "
                          f"({'unknown ' + unknown[0] if unknown else 'missing ' + missing[0]})")
    job_id, approvers = attestation["job_id"], attestation["approvers"]
    issued_at, signature = attestation["issued_at"], attestation["signature"]
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
        raise ContractError("attestation.job_id: expected a positive integer")
    if not isinstance(approvers, list) or not approvers or not all(isinstance(a, str) and a for a in approvers):
        raise ContractError("attestation.approvers: expected a non-empty list of usernames")
    if isinstance(issued_at, bool) or not isinstance(issued_at, int | float):
        raise ContractError("attestation.issued_at: expected a number (seconds since the epoch)")
    audit_head = AuditHead.from_dict(attestation["audit_head"], "attestation.audit_head")
    if not isinstance(signature, str):
        raise ContractError("attestation.signature: expected a hex string")
    expected = _signature(key, plan_hash, job_id, approvers, float(issued_at), audit_head)
    if not hmac.compare_digest(expected, signature.lower()):
        raise ContractError("attestation.signature does not match: it was not signed by the console for this plan "
                          "(another plan_hash, job, approvers or audit head, or another approval key)")
    age = now - float(issued_at)
    if age > max_age_s or age < -max_age_s:
        raise ContractError(f"attestation was issued {age:.0f} s ago, outside the {max_age_s:.0f} s it stays valid: "
                          "execute the job again from the console")
    return Attestation(job_id, tuple(approvers), float(issued_at), audit_head)
