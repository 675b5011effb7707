"""The engine's state folder (--state-dir): private JSON files replaced atomically, which survive a crash.

The spent-job ledger (engine/control/job_ledger.py) and the witnessed audit heads (engine/control/audit_witness.py)
live there: the
folder is 0700 and every file 0600, written to a temporary file, synced, renamed over the old one, and the rename
synced too, so a reader finds the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["private_folder", "write_json"]


def private_folder(folder: Path) -> None:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)


def write_json(path: Path, data: Any) -> None:
    """Replace `path` with `data` as JSON, atomically and durably."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.")  # created 0600
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(json.dumps(data))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a crash
    finally:
        os.close(folder)
