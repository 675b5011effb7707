"""The engine's counters and histograms, fed by the driver as requests and steps happen (prometheus_client).

Names are vLLM's under `seam_` (vllm:prompt_tokens_total -> seam_prompt_tokens_total) where the meaning is the same,
so a vLLM dashboard ports by swapping the prefix; docs/engine.md, "Metrics", has the table.

A request's timeline: submitted (the driver admitted it) -> scheduled (the first step that computes it: its queue
time) -> first token (time to first token; its prompt tokens are counted then, as vLLM does) -> each later token
(the gap since the one before: inter-token latency) -> finished, by reason (end-to-end latency of those that ran to
their end, `stop` or `length`). Unlike the latency log's medians, nothing here is cleared when the layout changes: a
counter only grows, and a request that spans a change is still one request.

Every metric is the engine's own (not registered in prometheus_client's global registry): the service's registry
collects this object (engine/telemetry/exposition.py), so several engines in one process never collide.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import Metric

from contracts.measurement import STEP_KINDS
from engine.telemetry.stage_timer import step_kind

# How a request ends (engine/control/protocol.py's RequestHandle.finish_reason); `cancelled` is vLLM's `abort`.
FINISH_REASONS = ("stop", "length", "cancelled", "refused", "error")
COMPLETED = ("stop", "length")
OPERATION_KINDS = ("cut", "shape", "ladder", "recovery")
OPERATION_OUTCOMES = ("succeeded", "failed", "rolled_back")

# Seconds. Finer at the low end than vLLM's: a decode step of this engine takes milliseconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0)
QUEUE_BUCKETS = E2E_BUCKETS
STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
                 2.5, 5.0, 10.0)


@dataclass
class _Timeline:
    submitted: float
    prompt_tokens: int
    scheduled: float | None = None
    latest: float | None = None  # when its latest token went out; None before the first


class EngineMetrics:
    """The driver's counters and histograms; a prometheus_client collector. Times are `time.monotonic()` seconds
    unless `at` is given. Thread-safe: requests arrive on HTTP threads, steps run on the engine loop."""

    def __init__(self, model_name: str, rank_names: Sequence[str]):
        model = ("model_name",)
        self._lock = threading.Lock()
        self._open: dict[int, _Timeline] = {}
        self._requests = Counter("seam_request_success", "Requests finished, by finish reason (every reason, as vLLM "
                                 "counts them).", (*model, "finished_reason"), registry=None)
        self._prompt = Counter("seam_prompt_tokens", "Prompt tokens of requests that reached their first token.",
                               model, registry=None)
        self._generation = Counter("seam_generation_tokens", "Output tokens handed to clients.", model,
                                   registry=None)
        self._ttft = Histogram("seam_time_to_first_token_seconds", "Time from admission to the first output token.",
                               model, buckets=TTFT_BUCKETS, registry=None)
        self._itl = Histogram("seam_inter_token_latency_seconds", "Time between consecutive output tokens of a "
                              "request.", model, buckets=ITL_BUCKETS, registry=None)
        self._e2e = Histogram("seam_e2e_request_latency_seconds", "Time from admission to the end of requests that "
                              "ran to their end (stop or length).", model, buckets=E2E_BUCKETS, registry=None)
        self._queue = Histogram("seam_request_queue_time_seconds", "Time from admission to the first step that "
                                "computes the request.", model, buckets=QUEUE_BUCKETS, registry=None)
        self._stage = Histogram("seam_rank_stage_time_seconds", "The rank's own compute time in one step (its stage), "
                                "by kind of step.", ("rank", "name", "kind"), buckets=STAGE_BUCKETS, registry=None)
        self._operations = Counter("seam_operations", "Operations (reconfigurations and recoveries) that finished, by "
                                   "kind and outcome.", ("kind", "outcome"), registry=None)
        # Children made up front: every series is exported from the start, at zero, so rate() sees its first rise.
        self.requests = {reason: self._requests.labels(model_name, reason) for reason in FINISH_REASONS}
        self.prompt_tokens = self._prompt.labels(model_name)
        self.generation_tokens = self._generation.labels(model_name)
        self.ttft, self.itl = self._ttft.labels(model_name), self._itl.labels(model_name)
        self.e2e, self.queue = self._e2e.labels(model_name), self._queue.labels(model_name)
        self.stages = [{kind: self._stage.labels(str(rank), name, kind) for kind in STEP_KINDS}
                       for rank, name in enumerate(rank_names)]
        for kind in OPERATION_KINDS:
            for outcome in OPERATION_OUTCOMES:
                self._operations.labels(kind, outcome)
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        for metric in (self._requests, self._prompt, self._generation, self._ttft, self._itl, self._e2e, self._queue,
                       self._stage, self._operations):
            yield from metric.collect()

    # --- fed by the driver -----------------------------------------------------------------------
    def submitted(self, request_id: int, prompt_tokens: int, at: float | None = None) -> None:
        with self._lock:
            self._open[request_id] = _Timeline(_now(at), prompt_tokens)

    def scheduled(self, request_ids: Iterable[int], at: float | None = None) -> None:
        """These requests are computed in the step about to run; the first time is the end of a request's queue."""
        now = _now(at)
        with self._lock:
            for request_id in request_ids:
                request = self._open.get(request_id)
                if request is not None and request.scheduled is None:
                    request.scheduled = now
                    self.queue.observe(now - request.submitted)

    def emitted(self, request_ids: Iterable[int], at: float | None = None) -> None:
        """One output token went out to each of these requests (one step's tokens share their time)."""
        now = _now(at)
        with self._lock:
            for request_id in request_ids:
                request = self._open.get(request_id)
                if request is None:
                    continue
                if request.latest is None:
                    self.ttft.observe(now - request.submitted)
                    self.prompt_tokens.inc(request.prompt_tokens)
                else:
                    self.itl.observe(now - request.latest)
                request.latest = now
                self.generation_tokens.inc()

    def finished(self, request_id: int, reason: str, at: float | None = None) -> None:
        now = _now(at)
        with self._lock:
            request = self._open.pop(request_id, None)
            if request is None:
                return
            counter = self.requests.get(reason) or self._requests.labels(self.model_name, reason)
            counter.inc()
            if reason in COMPLETED:
                self.e2e.observe(now - request.submitted)

    def stage_times(self, prefill_tokens: int, stage_ms: Sequence[float | None]) -> None:
        """Each rank's stage in one step, in ms as the ranks report it (None: not timed)."""
        kind = step_kind(prefill_tokens)
        for per_kind, ms in zip(self.stages, stage_ms, strict=True):
            if ms is not None:
                per_kind[kind].observe(ms / 1e3)

    def operation_finished(self, kind: str, outcome: str) -> None:
        self._operations.labels(kind, outcome).inc()


def _now(at: float | None) -> float:
    return time.monotonic() if at is None else at
