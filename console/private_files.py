"""Files that hold Seam's state or secrets are private to the user running it (docs/console.md, "Trust model").

Every console process and `make run` set `PRIVATE_UMASK` before they create anything, so the database, the var
folder, beat's schedule and pidfile, the audit anchor and the engine's ledger are 0600 files in 0700 folders; what an
older run or a restore left with looser modes is tightened by `make_private`. No Django here: console/settings.py and
launch/run.py both use it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PRIVATE_UMASK", "make_private", "use_private_umask"]

PRIVATE_UMASK = 0o077  # nothing for the group or others: another local account must not read a token or a key


def use_private_umask() -> None:
    """Every file and folder this process (and its children) creates from now on is private."""
    os.umask(PRIVATE_UMASK)


def make_private(path: Path) -> None:
    """Take the group's and others' bits off `path` and, for a folder, everything under it; a missing path is left
    alone. Symbolic links are not followed: what they point at is not Seam's to change."""
    if not path.exists() or path.is_symlink():
        return
    _tighten(path)
    if path.is_dir():
        for folder, folders, files in os.walk(path):
            for name in [*folders, *files]:
                entry = Path(folder, name)
                if not entry.is_symlink():
                    _tighten(entry)


def _tighten(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & 0o077:
        path.chmod(mode & 0o700)
