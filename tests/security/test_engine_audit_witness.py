"""The engine's witness of the console's audit head (engine/control/audit_witness.py; issue 30, item 3): per trail, the
newest
head any accepted attestation carried, on disk and private; a later attestation showing the trail went back (or
forked) is refused, and stays refused."""

from __future__ import annotations

import json
import stat
import time

import pytest

from contracts.attestation import Attestation, AuditHead
from engine.control.audit_witness import WITNESS_FILE, AuditWitness
from engine.control.protocol import ApplyRefused
from engine.errors import EngineError

TRAIL = "1a" * 32
NOW = time.time()


def carrying(seq: int, issued_at: float, hash_: str | None = None) -> Attestation:
    return Attestation(seq, ("rita",), issued_at, AuditHead(TRAIL, seq, hash_ or f"{seq:064x}"))


def refusal(witness: AuditWitness, attestation: Attestation) -> str:
    with pytest.raises(ApplyRefused) as refused:
        witness.witness(attestation)
    assert refused.value.status == 409
    return str(refused.value)


def test_an_older_head_issued_later_is_refused_as_a_rollback(tmp_path):
    """Pins _rollback's seq rule: without it the restored console's attestation passed."""
    witness = AuditWitness(tmp_path)
    witness.witness(carrying(40, NOW))
    message = refusal(witness, carrying(12, NOW + 60))
    assert "the console's audit trail went back from #40 to #12: a rollback of its database" in message
    assert witness.head(TRAIL).seq == 40  # the witness never moves back


def test_the_same_seq_with_another_hash_is_refused_as_a_fork(tmp_path):
    """Pins _rollback's hash rule: a database restored and rewritten up to the witnessed seq again."""
    witness = AuditWitness(tmp_path)
    witness.witness(carrying(40, NOW))
    message = refusal(witness, carrying(40, NOW + 60, "ee" * 32))
    assert "has another event #40 than it had" in message
    assert witness.head(TRAIL).hash == f"{40:064x}"


def test_an_older_head_signed_earlier_and_delivered_late_is_no_rollback(tmp_path):
    """Pins the issued_at rule: two workers racing (one signed at #39, the other at #40 and sent first) raise no
    false alarm; with the rule widened to every older seq, this one was refused."""
    witness = AuditWitness(tmp_path)
    witness.witness(carrying(40, NOW))
    witness.witness(carrying(39, NOW - 1))
    assert witness.head(TRAIL).seq == 40 and witness.head(TRAIL).rolled_back is None


def test_a_rollback_once_seen_keeps_the_trail_refused(tmp_path):
    """Pins the stickiness: a restored database that records its way past the witnessed seq is still refused (without
    it, the attestation at #41 passed and the engine forgot the rollback)."""
    witness = AuditWitness(tmp_path)
    witness.witness(carrying(40, NOW))
    refusal(witness, carrying(12, NOW + 60))
    message = refusal(witness, carrying(41, NOW + 120))
    assert "went back from #40 to #12" in message and "until its operator has looked" in message
    assert witness.head(TRAIL).rolled_back["from_seq"] == 40


def test_the_witness_survives_a_restart_in_a_private_file(tmp_path):
    """Pins the persistence (the state-dir file): with heads in memory only, a restarted engine let the rollback
    through."""
    folder = tmp_path / "state"
    AuditWitness(folder).witness(carrying(40, NOW))
    path = folder / WITNESS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert json.loads(path.read_text())["trails"][TRAIL]["seq"] == 40
    assert "went back from #40 to #12" in refusal(AuditWitness(folder), carrying(12, NOW + 60))


def test_an_unreadable_witness_file_refuses_the_engine_start(tmp_path):
    """A file silently emptied would let a rolled-back console through: the engine names the file and stops."""
    (tmp_path / WITNESS_FILE).write_text("{not json")
    with pytest.raises(EngineError, match=f"the witnessed audit heads {tmp_path / WITNESS_FILE} are unreadable"):
        AuditWitness(tmp_path)


def test_trails_are_witnessed_apart(tmp_path):
    """Another console database (another first event) starts a trail of its own: its low seq is no rollback."""
    witness = AuditWitness(tmp_path)
    witness.witness(carrying(40, NOW))
    other = Attestation(7, ("rita",), NOW + 60, AuditHead("2b" * 32, 3, "3c" * 32))
    witness.witness(other)
    assert [(head.trail, head.seq) for head in witness.heads()] == [(TRAIL, 40), ("2b" * 32, 3)]
