"""`make run`'s engine: its own demo engine (`engine serve` on the demo checkpoint and rig), or the engine that
SEAM_ENGINE_URL names, checked before anything of the stack starts so a wrong URL or token is refused at once."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import httpx

from contracts.attestation import APPROVAL_KEY_ENV, CONTROL_TOKEN_ENV, bearer_token
from contracts.control import EngineState, Refusal
from contracts.errors import ContractError
from contracts.layout import Cut

__all__ = ["check_external_engine", "checked_ladder", "demo_engine_command"]

ENGINE_URL_ENV = "SEAM_ENGINE_URL"


def checked_ladder(ladder: str) -> str:
    """`ladder` as `engine serve --ladder` takes it (cuts separated by ';'), or SystemExit naming what is wrong.
    Whether each rung fits the rig, and that the serving cut is one, is the engine's to say when it starts."""
    try:
        rungs = [Cut.from_text(rung.strip()) for rung in ladder.split(";")]
    except ContractError as error:
        sys.exit(f"--ladder {ladder!r}: {error}; a ladder is cuts separated by ';', e.g. '7,5,4;8,4,4'")
    return ";".join(rung.to_text() for rung in rungs)


def demo_engine_command(python: str, checkpoint: Path, port: int, channel: str, ladder: str | None,
                        state_dir: Path) -> list[str]:
    """`engine serve` of the demo engine; `state_dir` (in the stack's var/) keeps its spent-job ledger. Its Redis
    comes from REDIS_URL in its environment: a password in the URL must not be on a command line, which any local
    account can read."""
    command = [python, "-m", "engine", "serve", "--checkpoint", str(checkpoint), "--rig", "cpu-demo", "--port",
               str(port), "--telemetry-channel", channel, "--state-dir", str(state_dir)]
    return command + (["--ladder", ladder] if ladder else [])


def check_external_engine(environ: Mapping[str, str]) -> EngineState:
    """GET /control/state of the engine at SEAM_ENGINE_URL with SEAM_ENGINE_TOKEN: its state, or SystemExit naming
    what to fix (no token or approval key, unreachable, a refused token, any other answer)."""
    url = environ[ENGINE_URL_ENV].rstrip("/")
    for name, what in ((CONTROL_TOKEN_ENV, "control token"), (APPROVAL_KEY_ENV, "approval key")):
        if not environ.get(name):  # one generated here could never match the engine's
            sys.exit(f"{ENGINE_URL_ENV}={url} is set but {name} is not: set it to the {what} that engine was started "
                     f"with, or unset {ENGINE_URL_ENV} to have make run start its own demo engine")
    try:
        reply = httpx.get(f"{url}/control/state", headers=bearer_token(environ[CONTROL_TOKEN_ENV]), timeout=10)
    except (httpx.HTTPError, httpx.InvalidURL) as error:
        sys.exit(f"the engine at {ENGINE_URL_ENV}={url} cannot be reached ({type(error).__name__}: {error}): start "
                 f"it, fix the URL (e.g. http://gpu-host:8100), or unset {ENGINE_URL_ENV} to have make run start its "
                 "own demo engine")
    if reply.status_code == 401:
        sys.exit(f"the engine at {ENGINE_URL_ENV}={url} refused {CONTROL_TOKEN_ENV} (401: {_message(reply)}): set "
                 f"{CONTROL_TOKEN_ENV} to the control token that engine was started with")
    if reply.status_code == 200:
        try:
            return EngineState.from_dict(reply.json())
        except (ValueError, ContractError):  # not JSON, or not an engine's state
            pass
    sys.exit(f"the engine at {ENGINE_URL_ENV}={url} answered GET /control/state with {reply.status_code} "
             f"({_message(reply)}): is it a Seam engine?")


def _message(reply: httpx.Response) -> str:
    try:
        return Refusal.from_dict(reply.json()).message
    except (ValueError, ContractError):
        return reply.text[:200]
