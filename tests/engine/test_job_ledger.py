"""The spent-job ledger (engine/control/job_ledger.py): one attestation, one apply, on disk and private."""

from __future__ import annotations

import json
import stat
import time

import pytest

from contracts.attestation import ATTESTATION_MAX_AGE_S, Attestation, AuditHead
from engine.control.job_ledger import LEDGER_FILE, JobLedger
from engine.control.protocol import ApplyRefused
from engine.errors import EngineError


def attestation(job_id: int, issued_at: float | None = None) -> Attestation:
    return Attestation(job_id, ("rita",), time.time() if issued_at is None else issued_at,
                       AuditHead("1a" * 32, 1, "2b" * 32))


def test_a_failure_other_than_a_refusal_keeps_the_job_id_spent(tmp_path):
    """Pins `except ApplyRefused` in JobLedger.claim (issue 35, item 2): an operation may have begun after any
    other failure, so the id must stay spent; only a refusal frees it."""
    ledger = JobLedger(tmp_path)
    with pytest.raises(RuntimeError), ledger.claim(attestation(7)):
        raise RuntimeError("the driver failed after the operation began")
    with pytest.raises(ApplyRefused) as refused, ledger.claim(attestation(7)):
        pass
    assert refused.value.status == 409 and "job 7 already started an operation" in str(refused.value)
    assert 7 in JobLedger(tmp_path)  # and so it stays after a restart


def test_a_refusal_frees_the_job_id(tmp_path):
    ledger = JobLedger(tmp_path)
    with pytest.raises(ApplyRefused), ledger.claim(attestation(8)):
        raise ApplyRefused(409, "the plan is stale")
    assert 8 not in ledger and 8 not in JobLedger(tmp_path)
    with ledger.claim(attestation(8)):
        pass
    assert 8 in JobLedger(tmp_path)


def test_the_ledger_is_private_and_survives_a_new_process(tmp_path):
    folder = tmp_path / "state"
    ledger = JobLedger(folder)
    with ledger.claim(attestation(3)):
        pass
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / LEDGER_FILE).stat().st_mode) == 0o600
    assert list(json.loads((folder / LEDGER_FILE).read_text())["spent_jobs"]) == ["3"]
    with pytest.raises(ApplyRefused, match="job 3 already started"), JobLedger(folder).claim(attestation(3)):
        pass


def test_an_unreadable_ledger_refuses_the_start(tmp_path):
    (tmp_path / LEDGER_FILE).write_text("{not json")
    with pytest.raises(EngineError, match="spent-job ledger .* is unreadable"):
        JobLedger(tmp_path)


def test_entries_older_than_any_valid_attestation_are_dropped(tmp_path):
    ledger = JobLedger(tmp_path)
    with ledger.claim(attestation(1, issued_at=time.time() - 3 * ATTESTATION_MAX_AGE_S)):
        pass
    with ledger.claim(attestation(2)):
        pass
    assert 1 not in JobLedger(tmp_path) and 2 in JobLedger(tmp_path)


def test_without_a_folder_the_ledger_is_in_memory(tmp_path):
    ledger = JobLedger()
    with ledger.claim(attestation(4)):
        pass
    assert 4 in ledger and ledger.path is None
