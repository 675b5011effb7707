"""Every console process reads console/settings.py before it writes a file, and the settings set a private umask:
a database `manage.py migrate` creates, from a shell whose umask would leave it readable to every local account, is
0600 all the same, and so are its WAL companions. Pins issue 30, item 2 (the umask for the console's entry points,
not only for `make run`)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_database_migrate_creates_is_private_whatever_the_shell_umask(tmp_path):
    database = tmp_path / "fresh.sqlite3"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{database}", "SEAM_VAR_DIR": str(tmp_path / "var")}
    done = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.umask(0o022))
    assert done.returncode == 0, done.stderr
    made = [path for path in tmp_path.iterdir() if path.name.startswith("fresh.sqlite3")]
    assert database in made
    assert {path.name: oct(stat.S_IMODE(path.stat().st_mode)) for path in made} == {
        path.name: oct(0o600) for path in made}
