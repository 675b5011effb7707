"""Run a snippet under Triton's interpreter (TRITON_INTERPRET=1) in a fresh process: the kernels run on CPU tensors.

The variable must be set before Triton is imported, hence the subprocess. The snippet runs in the repository root,
so it imports the tests' modules as `tests.engine.<module>`; it prints one number per line (relative errors, counts);
they come back as floats.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_interpreted(script: str, timeout_s: float = 300.0) -> list[float]:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return [float(line) for line in done.stdout.split()]
