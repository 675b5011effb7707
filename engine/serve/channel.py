"""The channel between `engine serve`'s two processes, and every message that crosses it.

The driver's process holds the driver, its rank processes and the engine loop; the front end's (engine/serve/
frontend.py) holds HTTP, the OpenAI dialect, tokenizing, detokenizing and SSE, so none of that shares the engine
loop's GIL. They talk over one multiprocessing.connection pair on a Unix socket in a fresh 0700 folder, with an authkey
drawn per start and handed to the front end the driver spawns (never through the environment or the command line): a
connection without it is refused before anything it sent is unpickled. The driver listens only until its front end
is in, then removes the socket.

Front end -> driver: `Submit` and the `Ask` kinds (each names the Driver call that answers it), numbered by `call`;
`Cancel`, which needs no answer. Driver -> front end: `Hello` once, then one `Answer` or `Failed` per call, and `News`:
every open request's new tokens, their logprobs entries and its end since the last `News` (one message per wake of the
driver side's sender, so about one per engine step), with the max_model_len of the layout served.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import tempfile
import threading
from dataclasses import dataclass
from multiprocessing.connection import AuthenticationError, Client, Connection, Listener
from pathlib import Path
from typing import Any

from contracts.control import EngineState, Health, Operation
from contracts.errors import ContractError
from contracts.plan import PlanReply
from contracts.telemetry import Snapshot
from engine.control.protocol import ApplyRefused, Driver
from engine.errors import EngineError, EngineRequestError
from engine.runtime.sampler import SamplingParams, TokenLogprobs
from engine.serve.access import Credentials
from engine.serve.cross_site import AllowedHosts
from solvers.errors import SolverError

log = logging.getLogger("seam.engine")

SOCKET_NAME = "driver.sock"


# --- the channel itself ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChannelAddress:
    """Where the driver listens and the key a peer must prove it holds. Kept out of repr: the key is the secret."""

    path: str
    authkey: bytes = b""

    def __repr__(self) -> str:
        return f"ChannelAddress({self.path!r})"

    @classmethod
    def fresh(cls) -> ChannelAddress:
        # The system's temp folder, not the state folder: a Unix socket's path must stay under ~100 bytes.
        folder = tempfile.mkdtemp(prefix="seam-channel-")  # 0700: nobody else can even reach the socket
        return cls(str(Path(folder) / SOCKET_NAME), secrets.token_bytes(32))

    def listen(self) -> Listener:
        return Listener(self.path, family="AF_UNIX", authkey=self.authkey)

    def connect(self) -> Connection:
        return Client(self.path, family="AF_UNIX", authkey=self.authkey)

    def remove(self) -> None:
        shutil.rmtree(Path(self.path).parent, ignore_errors=True)


def accept_front_end(listener: Listener, alive: Any, timeout_s: float) -> Connection:
    """The first connection that proves the key; the others are refused and logged. `alive()` says whether the front
    end is still there to connect: the wait ends (EngineError) when it is not, or after `timeout_s`."""
    accepted: list[Connection] = []
    done = threading.Event()

    def run() -> None:
        while not done.is_set():
            try:
                accepted.append(listener.accept())
                break
            except (AuthenticationError, EOFError, OSError) as error:
                if done.is_set():  # the wait is over and the listener closed under this accept
                    break
                # A peer without the key, or one that hung up mid-handshake: refused, and the wait goes on.
                log.warning("the driver's channel refused a connection: %s", error or type(error).__name__)
        done.set()

    threading.Thread(target=run, name="seam-channel-accept", daemon=True).start()
    waited = 0.0
    while not done.wait(0.1):
        waited += 0.1
        if not alive() or waited > timeout_s:
            done.set()
            raise EngineError("the front end exited before it connected to the driver" if not alive() else
                              f"the front end did not connect to the driver within {timeout_s:g} s")
    if not accepted:
        raise EngineError("the driver's channel closed before the front end connected")
    return accepted[0]


@dataclass(frozen=True)
class FrontEndSpec:
    """What the driver's process hands the front end it spawns: where to find the driver and what to serve."""

    address: ChannelAddress
    checkpoint: str  # its tokenizer is loaded in the front end
    host: str
    port: int
    credentials: Credentials
    max_body_bytes: int
    allowed_hosts: AllowedHosts
    state_dir: Path  # the spent-job ledger and the witnessed audit heads (engine/serve/frontend.py says why here)
    chat_max_tokens: int


# --- front end -> driver -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    """Admit a request: answered with its request id, or Failed (kind `request`) naming why it can never fit."""

    call: int
    prompt: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True)
class Cancel:
    """Drop the request at the next step boundary, ending it with `reason` (Driver.cancel). No answer."""

    request_id: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class Ask:
    """A call answered by the driver's reply, as the Driver protocol types it (engine/control/protocol.py)."""

    call: int

    def answer(self, driver: Driver) -> Any:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class StateAsk(Ask):
    """GET /control/state."""

    def answer(self, driver: Driver) -> EngineState:
        return driver.state()


@dataclass(frozen=True, kw_only=True)
class PlanAsk(Ask):
    """POST /control/plan, the body as the client sent it."""

    body: dict

    def answer(self, driver: Driver) -> PlanReply:
        return driver.plan(self.body)


@dataclass(frozen=True, kw_only=True)
class ApplyAsk(Ask):
    """POST /control/apply, once the front end verified the attestation and claimed its job id."""

    plan: dict
    plan_hash: str
    job_id: int | None

    def answer(self, driver: Driver) -> str:
        return driver.apply(self.plan, self.plan_hash, self.job_id)


@dataclass(frozen=True, kw_only=True)
class OperationAsk(Ask):
    operation_id: str

    def answer(self, driver: Driver) -> Operation | None:
        return driver.operation(self.operation_id)


@dataclass(frozen=True, kw_only=True)
class FindOperationsAsk(Ask):
    plan_hash: str

    def answer(self, driver: Driver) -> list[Operation]:
        return driver.find_operations(self.plan_hash)


@dataclass(frozen=True, kw_only=True)
class OperationsAsk(Ask):
    """Every operation the driver holds (/metrics counts them by status)."""

    def answer(self, driver: Driver) -> list[Operation]:
        return driver.operations()


@dataclass(frozen=True, kw_only=True)
class HealthAsk(Ask):
    def answer(self, driver: Driver) -> Health:
        return driver.health()


@dataclass(frozen=True, kw_only=True)
class SnapshotAsk(Ask):
    """The telemetry snapshot /metrics reads (its seq is not advanced: only the publisher does)."""

    def answer(self, driver: Driver) -> Snapshot:
        return driver.snapshot()


@dataclass(frozen=True, kw_only=True)
class MetricsAsk(Ask):
    """The driver's counters and histograms as prometheus_client metric families (engine/telemetry/metrics.py)."""

    def answer(self, driver: Driver) -> list:
        return list(driver.metrics.collect())


# --- driver -> front end -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    """The driver's first message: what the front end serves, and the driver's pid (printed, and for tests)."""

    model_name: str
    max_model_len: int
    pid: int


@dataclass(frozen=True)
class Answer:
    call: int
    value: Any  # the Driver call's reply (contracts/ types, a request id, an operation id)


# Exceptions the service maps to a status (engine/serve/http.py), rebuilt on the front end's side as they were raised.
_KINDS: dict[str, type[Exception]] = {"request": EngineRequestError, "contract": ContractError, "solver": SolverError}


@dataclass(frozen=True)
class Failed:
    """A call that raised: `kind` names which exception to raise again in the front end (`apply_refused` with its
    HTTP status, `request`, `contract`, `solver`; anything else is `internal`, its traceback in the driver's log)."""

    call: int
    kind: str
    message: str
    status: int = 500

    @classmethod
    def of(cls, call: int, error: Exception) -> Failed:
        if isinstance(error, ApplyRefused):
            return cls(call, "apply_refused", str(error), error.status)
        for kind, kind_type in _KINDS.items():
            if isinstance(error, kind_type):
                return cls(call, kind, str(error), 400)
        log.error("a front end's call failed in the driver", exc_info=error)
        return cls(call, "internal", f"{type(error).__name__}: {error}")

    def error(self) -> Exception:
        if self.kind == "apply_refused":
            return ApplyRefused(self.status, self.message)
        kind_type = _KINDS.get(self.kind)
        return kind_type(self.message) if kind_type else RuntimeError(f"the driver failed: {self.message}")


@dataclass(frozen=True)
class RequestNews:
    """One request's news since the last: its new tokens, their logprobs entries (empty unless it asked for them),
    and its end (finish_reason, with `error` when it failed), once it ended."""

    request_id: int
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprobs, ...]
    finish_reason: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class News:
    requests: tuple[RequestNews, ...]
    max_model_len: int  # of the layout served now: a shape change moves it
