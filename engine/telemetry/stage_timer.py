"""Each rank's own compute time per step (its stage), and the driver's summary of recent steps.

A stage is what a rank computes in a step: its layers (and the embedding or the logits where they live), not the
wait for its upstream peer's activations. Stage times per rank are what the solvers' timing model is calibrated
from (solvers.timing.calibrate). On CUDA the stage is timed with events and the rank waits for its own kernels
before it replies, which the step's end waits for anyway.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

import torch

from contracts.measurement import NO_STEPS, STEP_KINDS, StageStats

WINDOW = 256  # steps kept: a few seconds of serving, enough for a median of one workload


def step_kind(prefill_tokens: int) -> str:
    """A step is `prefill` when it computes any prompt token, else `decode` (every row one decode token)."""
    return "prefill" if prefill_tokens else "decode"


class StageTimer:
    """`with timer: ...` times the block; `timer.ms` holds the last block's milliseconds."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.ms: float | None = None
        self._began = 0.0
        self._events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    def __enter__(self) -> StageTimer:
        if self.cuda:
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()
        else:
            self._began = time.perf_counter()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.cuda:
            start, end = self._events
            end.record()
            end.synchronize()
            self.ms = start.elapsed_time(end)
        else:
            self.ms = (time.perf_counter() - self._began) * 1e3


class StageLog:
    """The last WINDOW steps' stage times per rank, each with its kind: decode (every row one decode token) or
    prefill (any prompt token). Cleared when the layout changes: another cut has other stages."""

    def __init__(self) -> None:
        self.steps: deque[tuple[str, int, list[float], float | None]] = deque(maxlen=WINDOW)

    def add(self, prefill_tokens: int, decode_tokens: int, stage_ms: list[float | None],
            host_ms: float | None = None) -> None:
        """`host_ms`: the driver's own time in the step, outside its wait on the ranks."""
        if all(ms is not None for ms in stage_ms):
            self.steps.append((step_kind(prefill_tokens), prefill_tokens + decode_tokens, list(stage_ms), host_ms))

    def clear(self) -> None:
        self.steps.clear()

    def summary(self) -> dict[str, StageStats]:
        """Per kind ("decode", "prefill"): how many steps, their median tokens, and per rank the median stage ms
        and its spread (the sample standard deviation over the steps; 0 with one step), and the driver's host time a
        step: median and 90th percentile."""
        return {kind: _stats([(tokens, ms, host) for k, tokens, ms, host in self.steps if k == kind])
                for kind in STEP_KINDS}


def _stats(steps: list[tuple[int, list[float], float | None]]) -> StageStats:
    if not steps:
        return NO_STEPS
    ranks = list(zip(*(ms for _, ms, _ in steps), strict=True))
    host = [ms for _, _, ms in steps if ms is not None]
    p90 = statistics.quantiles(host, n=10, method="inclusive")[8] if len(host) > 1 else (host or [None])[0]
    return StageStats(len(steps), float(statistics.median(tokens for tokens, _, _ in steps)),
                      tuple(round(statistics.median(rank), 4) for rank in ranks),
                      tuple(round(statistics.stdev(rank), 4) if len(steps) > 1 else 0.0 for rank in ranks),
                      round(statistics.median(host), 4) if host else None, None if p90 is None else round(p90, 4))
