"""What the HTTP service and telemetry need from the driver: one small, thread-safe surface.

The driver (engine/control/driver.py) owns the scheduler, the rank processes and reconfiguration; the
service (engine/serve/http.py) only translates HTTP to these calls, and telemetry only reads. The replies are
contracts/ types, which the service writes with their `to_dict()`. Under `engine serve` the service runs in a front end
process of its own and reaches the driver through engine/serve/remote_driver.py's RemoteDriver, this same surface over
the channel of engine/serve/channel.py.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from contracts.control import EngineState, Health, Operation
from contracts.plan import PlanReply
from contracts.telemetry import Snapshot
from engine.runtime.sampler import SamplingParams, TokenLogprobs


class ApplyRefused(Exception):
    """A plan the driver will not apply; `status` is the HTTP status the service answers with.

    400: malformed or a plan_hash that does not match the plan; 409: the plan's incumbent fingerprint
    is not the current layout, or another operation is running; 422: the plan is infeasible.
    """

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class DriverUnavailable(Exception):
    """The driver cannot be reached (it shut down, died or stopped answering): the service answers 503."""


@dataclass
class RequestHandle:
    """One admitted request. `tokens` yields each new token id as it is sampled, then None at the end.

    The driver reports through `emit` and `end` only; each calls `listener` (when one is set) afterwards, so a reader
    can sleep until there is something to read instead of polling (the service's streams: one wake-up per token)."""

    request_id: int
    prompt_ids: list[int]
    tokens: queue.Queue = field(default_factory=queue.Queue)
    done: threading.Event = field(default_factory=threading.Event)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "refused" or "error" (with `error`)
    error: str | None = None
    listener: Callable[[], None] | None = None
    # The sequence's own list (engine/runtime/sequence.py): the engine thread appends a token's entry before it emits
    # the token, so a reader that has token i may read entry i. Empty unless the request asked for logprobs.
    logprobs: list[TokenLogprobs] = field(default_factory=list)

    def emit(self, token: int) -> None:
        self.token_ids.append(token)
        self.tokens.put(token)
        self._tell()

    def end(self, finish_reason: str, error: str | None = None) -> None:
        self.finish_reason, self.error = finish_reason, error
        self.tokens.put(None)
        self.done.set()
        self._tell()

    def _tell(self) -> None:
        if self.listener is not None:
            self.listener()

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


class Driver(Protocol):
    model_name: str  # served as the OpenAI model id
    max_model_len: int

    def submit(self, prompt: list[int] | str, params: SamplingParams) -> RequestHandle:
        """Admit a request (EngineRequestError, naming why, if it can never fit or is malformed)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (EngineError when the checkpoint has no tokenizer)."""
        ...

    def max_prompt_chars(self) -> int | None:
        """The most characters a text prompt may have before it is tokenized: no longer one fits max_model_len
        tokens (None: no tokenizer, so no text prompt at all)."""
        ...

    def decode(self, token_ids: list[int]) -> str:
        ...

    def state(self) -> EngineState:
        """GET /control/state: the layout served, its phase and pool, the ranks, the ladder, the engine's measurement
        of the layout and its health."""
        ...

    def plan(self, body: dict[str, Any]) -> PlanReply:
        """POST /control/plan: the plan, its hash, whether it is feasible and why not; changes nothing.

        Raises ContractError for a malformed body, SolverError for one the planner cannot price (the service answers
        400 to either)."""
        ...

    def apply(self, plan: dict[str, Any], plan_hash: str, job_id: int | None = None) -> str:
        """POST /control/apply: start the operation (for the attested console job `job_id`) and return its id, or
        raise ApplyRefused."""
        ...

    def find_operations(self, plan_hash: str) -> list[Operation]:
        """GET /control/operations?plan_hash=: the operations started for that plan, oldest first."""
        ...

    def operation(self, operation_id: str) -> Operation | None:
        """GET /control/operations/{id}: its status, phase, progress and figures; None if unknown."""
        ...

    def health(self) -> Health:
        """GET /healthz: not ok while broken or in a recovery loop (optional: the service answers ok for a driver
        without it)."""
        ...

    def snapshot(self) -> Snapshot:
        """The current telemetry snapshot, numbered by `seq`."""
        ...

    def shutdown(self) -> None:
        ...
