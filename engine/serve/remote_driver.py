"""The Driver protocol (engine/control/protocol.py) in the front end's process, over the channel to the real driver
(engine/serve/channel.py), so engine/serve/http.py serves it unchanged.

Tokenizing and detokenizing are local: the checkpoint's tokenizer is loaded here. Every other call is one message
and its answer; a request's tokens come back in the driver's `News` and are fed into a local RequestHandle (emit, end),
which wakes its stream as the driver's own handles do. When the driver's end of the channel closes (it shut down or
died), every open request ends with an explicit error, every waiting call raises DriverUnavailable, and `lost` is set.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from contracts.control import EngineState, Health, Operation
from contracts.plan import PlanReply
from contracts.telemetry import Snapshot
from engine.config import ModelConfig
from engine.control.protocol import DriverUnavailable, RequestHandle
from engine.runtime.sampler import SamplingParams
from engine.runtime.text import CheckpointText
from engine.serve.channel import (
    Answer,
    ApplyAsk,
    Ask,
    Cancel,
    Failed,
    FindOperationsAsk,
    HealthAsk,
    Hello,
    MetricsAsk,
    News,
    OperationAsk,
    OperationsAsk,
    PlanAsk,
    SnapshotAsk,
    StateAsk,
    Submit,
)

log = logging.getLogger("seam.engine")

HELLO_S = 60.0
# The longest a call waits for its answer: a plan's pricing takes seconds at most, so past this the driver is stuck.
CALL_TIMEOUT_S = 120.0
DRIVER_GONE = "the engine's driver went away"


class RemoteDriver:
    def __init__(self, conn: Connection, checkpoint: Path):
        self.conn = conn
        if not conn.poll(HELLO_S):
            raise DriverUnavailable(f"the driver sent nothing within {HELLO_S:g} s of the channel opening")
        hello = conn.recv()
        if not isinstance(hello, Hello):
            raise DriverUnavailable(f"the driver's first message is {type(hello).__name__}, not Hello")
        self.model_name, self.max_model_len, self.driver_pid = hello.model_name, hello.max_model_len, hello.pid
        self.text = CheckpointText(checkpoint, ModelConfig.from_pretrained(checkpoint).vocab_size)
        self.metrics = _RemoteMetrics(self)
        self.lost = threading.Event()
        self._closing = False
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._calls = itertools.count()
        self._pending: dict[int, tuple[Future, list[int] | None]] = {}  # call -> (its answer, a submit's prompt)
        self._handles: dict[int, RequestHandle] = {}  # request id -> the open request's handle
        threading.Thread(target=self._read, name="seam-channel-read", daemon=True).start()

    # --- local: the checkpoint's text side -------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.text.encode(text)

    def max_prompt_chars(self) -> int | None:
        return self.text.max_prompt_chars(self.max_model_len)

    def decode(self, token_ids: list[int]) -> str:
        return self.text.decode(token_ids)

    # --- requests --------------------------------------------------------------------------------------------
    def submit(self, prompt: list[int] | str, params: SamplingParams) -> RequestHandle:
        ids = self.text.prompt_ids(prompt)
        return self._call(lambda call: Submit(call, tuple(ids), params), ids)

    def cancel(self, request_id: int, reason: str = "cancelled") -> None:
        self._send(Cancel(request_id, reason))

    # --- control: one message and its answer each ------------------------------------------------------------
    def state(self) -> EngineState:
        return self._ask(StateAsk)

    def plan(self, body: dict[str, Any]) -> PlanReply:
        return self._ask(PlanAsk, body=body)

    def apply(self, plan: dict[str, Any], plan_hash: str, job_id: int | None = None) -> str:
        return self._ask(ApplyAsk, plan=plan, plan_hash=plan_hash, job_id=job_id)

    def find_operations(self, plan_hash: str) -> list[Operation]:
        return self._ask(FindOperationsAsk, plan_hash=plan_hash)

    def operation(self, operation_id: str) -> Operation | None:
        return self._ask(OperationAsk, operation_id=operation_id)

    def operations(self) -> list[Operation]:
        return self._ask(OperationsAsk)

    def health(self) -> Health:
        return self._ask(HealthAsk)

    def snapshot(self) -> Snapshot:
        return self._ask(SnapshotAsk)

    def metric_families(self) -> list:
        """The driver's counters and histograms as prometheus_client families (engine/telemetry/metrics.py)."""
        return self._ask(MetricsAsk)

    def shutdown(self) -> None:
        """The front end is done: closing the channel tells the driver, which cancels whatever is still open."""
        self._closing = True
        self.conn.close()

    def _ask(self, kind: type[Ask], **fields: Any) -> Any:
        return self._call(lambda call: kind(call=call, **fields))

    def _call(self, message: Any, prompt: list[int] | None = None) -> Any:
        future: Future = Future()
        with self._lock:
            if self.lost.is_set():
                raise DriverUnavailable(DRIVER_GONE)
            call = next(self._calls)
            self._pending[call] = (future, prompt)
        self._send(message(call))
        try:
            return future.result(CALL_TIMEOUT_S)
        except FutureTimeout:
            future.cancel()  # a request admitted after all is cancelled when its answer comes (_settle)
            raise DriverUnavailable(f"the driver did not answer within {CALL_TIMEOUT_S:g} s") from None

    def _send(self, message: object) -> None:
        with contextlib.suppress(OSError), self._send_lock:  # the driver's end is closed: the reader ends what is open
            self.conn.send(message)

    # --- driver -> front end ---------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                message = self.conn.recv()
                if isinstance(message, News):
                    self._take(message)
                elif isinstance(message, Answer | Failed):
                    self._settle(message)
                else:
                    log.error("the driver sent %s, which is no channel message: ignored", type(message).__name__)
        except (EOFError, OSError):
            pass
        finally:
            self._lose()

    def _settle(self, message: Answer | Failed) -> None:
        with self._lock:
            future, prompt = self._pending.pop(message.call, (None, None))
        if future is None:
            log.error("the driver answered call %d, which nobody made: ignored", message.call)
            return
        if future.cancelled():  # its caller gave up waiting: nobody would read a request admitted meanwhile
            if isinstance(message, Answer) and prompt is not None:
                self.cancel(message.value)
            return
        if isinstance(message, Failed):
            future.set_exception(message.error())
        elif prompt is not None:  # a Submit: the handle exists before the request's first news is read
            handle = self._handles[message.value] = RequestHandle(message.value, prompt)
            future.set_result(handle)
        else:
            future.set_result(message.value)

    def _take(self, news: News) -> None:
        self.max_model_len = news.max_model_len
        for item in news.requests:
            handle = self._handles.get(item.request_id)
            if handle is None:
                continue
            handle.logprobs.extend(item.logprobs)  # before the tokens: a reader that has token i may read entry i
            for token in item.tokens:
                handle.emit(token)
            if item.finish_reason is not None:
                del self._handles[item.request_id]
                handle.end(item.finish_reason, item.error)

    def _lose(self) -> None:
        with self._lock:
            self.lost.set()
            pending, self._pending = self._pending, {}
        if not self._closing:
            log.error("%s: ending %d open requests with an error", DRIVER_GONE, len(self._handles))
        for future, _ in pending.values():
            future.set_exception(DriverUnavailable(DRIVER_GONE))
        handles, self._handles = self._handles, {}
        for handle in handles.values():
            handle.end("error", DRIVER_GONE)


class _RemoteMetrics:
    """The driver's counters and histograms, collected over the channel at each scrape (a prometheus_client
    collector, as the driver's EngineMetrics is in its own process)."""

    def __init__(self, driver: RemoteDriver):
        self.driver = driver

    def collect(self) -> list:
        return self.driver.metric_families()
