"""The job ids this engine started an operation for, kept on disk so a captured /control/apply cannot be replayed,
not even after the engine restarts (docs/engine.md, "Trust model").

One attestation, one apply: a job id is claimed before its plan goes to the driver and written to the ledger file
(private: 0600 in a 0700 folder, replaced atomically and synced) before the apply is acknowledged. Only a refusal
(ApplyRefused: surely nothing started) frees the id again; after any other failure an operation may have begun, so
the id stays spent. An entry is dropped once its attestation is too old to verify anyway (twice
ATTESTATION_MAX_AGE_S after it was issued: a replay of it is refused by its age).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from contracts.attestation import ATTESTATION_MAX_AGE_S, Attestation
from engine.control.protocol import ApplyRefused
from engine.control.state_files import private_folder, write_json
from engine.errors import EngineError

__all__ = ["LEDGER_FILE", "STATE_DIR_ENV", "JobLedger", "default_state_dir"]

STATE_DIR_ENV = "SEAM_ENGINE_STATE_DIR"
LEDGER_FILE = "spent_jobs.json"
_KEEP_S = 2 * ATTESTATION_MAX_AGE_S


def default_state_dir(port: int) -> Path:
    """$SEAM_ENGINE_STATE_DIR/port-<port>, else ~/.local/state/seam/engine-port-<port>: one folder per engine on a
    host, which a restart on the same port finds again."""
    root = os.environ.get(STATE_DIR_ENV)
    if root:
        return Path(root) / f"port-{port}"
    return Path.home() / ".local" / "state" / "seam" / f"engine-port-{port}"


class JobLedger:
    """Spent job ids with the time their attestation was issued; in memory only when `folder` is None (tests that
    build the app in-process), else in `folder`/spent_jobs.json.

    Only the service's event loop calls it, and a claim's check and add run with no await between them."""

    def __init__(self, folder: Path | None = None) -> None:
        self.path = None if folder is None else Path(folder) / LEDGER_FILE
        self._spent: dict[int, float] = {}
        if self.path is not None:
            private_folder(self.path.parent)
            self._spent = _read(self.path)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._spent

    @contextmanager
    def claim(self, attestation: Attestation) -> Iterator[None]:
        """Hold the attestation's job id while its apply runs; released again only when the driver refused the plan
        (then surely nothing started: on any other failure an operation may have begun, so the id stays spent)."""
        job_id = attestation.job_id
        if job_id in self._spent:
            raise ApplyRefused(409, f"job {job_id} already started an operation on this engine: an attestation "
                                    "is good for one apply (find that operation with GET "
                                    "/control/operations?plan_hash=)")
        self._spent[job_id] = attestation.issued_at
        self._save()
        try:
            yield
        except ApplyRefused:
            del self._spent[job_id]
            self._save()
            raise

    def _save(self) -> None:
        if self.path is None:
            return
        horizon = time.time() - _KEEP_S
        self._spent = {job: issued for job, issued in self._spent.items() if issued >= horizon}
        write_json(self.path, {"spent_jobs": {str(job): issued for job, issued in sorted(self._spent.items())}})


def _read(path: Path) -> dict[int, float]:
    """The ledger as written; EngineError naming the file when it is unreadable (a ledger silently emptied would
    let every spent attestation apply again)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        return {int(job): float(issued) for job, issued in data["spent_jobs"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise EngineError(f"the spent-job ledger {path} is unreadable ({type(error).__name__}: {error}): restore it "
                          "from a backup, or delete it knowingly (every attestation of the last two days could then "
                          "apply once more)") from None
