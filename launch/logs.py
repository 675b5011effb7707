"""Where `make run`'s output goes. Each process of the stack writes to var/log/<name>.log (0600 files in a 0700
folder: a process may print what another local account must not read); the terminal gets the banner and then only
state changes, each of those also kept, timestamped, in var/log/launch.log.

A log is emptied the first time a run opens it and appended to after, so a process restarted by the supervisor
keeps the output of the run that died before it, and a file never outgrows one run of `make run`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from console.private_files import make_private

__all__ = ["Logs", "Terminal", "TerminalHandler", "shown_path"]


class Logs:
    """The stack's log folder, var/log."""

    def __init__(self, var: Path) -> None:
        self.folder = var / "log"
        self.folder.mkdir(mode=0o700, exist_ok=True)
        make_private(self.folder)  # what an older run, a copy or a restore left readable to others
        self._opened: set[str] = set()

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.log"

    def shown(self, name: str) -> str:
        """The path of `name`'s log as the terminal shows it: relative to the working folder when under it."""
        return shown_path(self.path(name))

    def shown_folder(self) -> str:
        return shown_path(self.folder)

    def open(self, name: str) -> int:
        """A descriptor that appends to `name`'s log, emptied when this run opens it for the first time."""
        first = 0 if name in self._opened else os.O_TRUNC
        descriptor = os.open(self.path(name), os.O_WRONLY | os.O_CREAT | os.O_APPEND | first, 0o600)
        os.fchmod(descriptor, 0o600)  # the mode above only applies to a file this call creates
        self._opened.add(name)
        return descriptor

    def stream(self, name: str) -> TextIO:
        return os.fdopen(self.open(name), "a", buffering=1)

    def tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join(self.path(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def run(self, name: str, command: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> None:
        """Run a one-off step (migrate, collectstatic, ...) to completion with its output in `name`'s log; on
        failure, SystemExit naming the log and showing its last lines."""
        descriptor = self.open(name)
        try:
            done = subprocess.run(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=descriptor,
                                  stderr=subprocess.STDOUT, check=False)
        finally:
            os.close(descriptor)
        if done.returncode != 0:
            sys.exit(f"make run: {name} exited with status {done.returncode}; the end of {self.shown(name)}:\n"
                     f"{self.tail(name)}")


def shown_path(path: Path) -> str:
    """`path` as the terminal shows it: relative to the working folder when under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class Terminal:
    """What the person who typed `make run` reads: the banner as it is, state changes with the time in front."""

    def __init__(self, logs: Logs, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.file = logs.stream("launch")

    def say(self, message: str) -> None:
        """One state change: a process exited or was restarted, the engine is ready, ..."""
        self._write(f"{time.strftime('%H:%M:%S')} {message}")

    def show(self, text: str) -> None:
        self._write(text)

    def _write(self, text: str) -> None:
        print(text, file=self.out, flush=True)
        self.file.write(text + "\n")


class TerminalHandler(logging.Handler):
    """Log records as state changes on the terminal (demo traffic failing, then answering again)."""

    def __init__(self, terminal: Terminal, level: int = logging.INFO) -> None:
        super().__init__(level)
        self.terminal = terminal

    def emit(self, record: logging.LogRecord) -> None:
        self.terminal.say(self.format(record))
