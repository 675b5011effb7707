"""Run a snippet under Triton's interpreter (TRITON_INTERPRET=1) in a process of its own: kernels run on CPU tensors.

The variable must be set before Triton is imported, hence another process. Importing torch, Triton, transformers and
the engine takes seconds, so one warm process does that once per run and forks a child for each snippet: every
snippet starts from a fresh copy of that process, as a new interpreter would, and nothing one sets (deterministic
algorithms, seeds, patched modules) reaches the next. The snippet runs in the repository root, imports the tests'
modules as `tests.engine.<module>` and prints one number per line (relative errors, counts); they come back as floats.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The warm process: reads one request a line ({"script", "stdout", "stderr"}), forks, and answers the child's exit
# status on the line it was started with (its own stdout, kept apart from the child's).
_SERVER = r"""
import json, os, sys, traceback
import torch, triton  # noqa: F401
import tests.support.engine_checkpoints  # noqa: F401  (transformers and the engine's model, which most snippets use)
answers = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        code = 0
        try:
            exec(compile(request["script"], "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as stop:
            if stop.code is not None and not isinstance(stop.code, int):
                print(stop.code, file=sys.stderr)
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    answers.write(json.dumps(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])) + "\n")
    answers.flush()
"""


class _Interpreter:
    """The warm process, started on first use and ended with the test run."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="seam-interpret-"))
        self.log = open(self.folder / "server.log", "w")  # noqa: SIM115  (closed in stop)
        self.process = subprocess.Popen([sys.executable, "-c", _SERVER], cwd=ROOT, text=True, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, start_new_session=True,
                                        env={**os.environ, "TRITON_INTERPRET": "1"})

    def run(self, script: str, timeout_s: float) -> subprocess.CompletedProcess:
        out, err = self.folder / "stdout", self.folder / "stderr"
        self.process.stdin.write(json.dumps({"script": script, "stdout": str(out), "stderr": str(err)}) + "\n")
        self.process.stdin.flush()
        if not select.select([self.process.stdout], [], [], timeout_s)[0]:
            self.stop()
            raise subprocess.TimeoutExpired([sys.executable, "-c", script], timeout_s)
        answer = self.process.stdout.readline()
        if not answer:
            self.stop()
            raise RuntimeError("the interpreter process ended:\n" + (self.folder / "server.log").read_text()[-4000:])
        return subprocess.CompletedProcess(script, json.loads(answer), out.read_text(), err.read_text())

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


_interpreter: _Interpreter | None = None


def run_interpreted(script: str, timeout_s: float = 300.0) -> list[float]:
    global _interpreter
    pytest.importorskip("triton")
    if _interpreter is None or not _interpreter.alive():
        _interpreter = _Interpreter()
        atexit.register(_interpreter.stop)
    done = _interpreter.run(script, timeout_s)
    assert done.returncode == 0, done.stderr[-4000:]
    return [float(line) for line in done.stdout.split()]
