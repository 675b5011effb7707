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
from collections.abc import Iterable

import torch

WINDOW = 256  # steps kept: a few seconds of serving, enough for a median of one workload


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
        self.steps: deque[tuple[str, int, list[float]]] = deque(maxlen=WINDOW)

    def add(self, prefill_tokens: int, decode_tokens: int, stage_ms: list[float | None]) -> None:
        if all(ms is not None for ms in stage_ms):
            kind = "prefill" if prefill_tokens else "decode"
            self.steps.append((kind, prefill_tokens + decode_tokens, list(stage_ms)))

    def clear(self) -> None:
        self.steps.clear()

    def summary(self) -> dict:
        """Per kind: how many steps, their median tokens, and each rank's median stage ms (None without steps)."""
        return {kind: _medians([(tokens, ms) for k, tokens, ms in self.steps if k == kind])
                for kind in ("decode", "prefill")}


def _medians(steps: Iterable[tuple[int, list[float]]]) -> dict:
    steps = list(steps)
    if not steps:
        return {"steps": 0, "median_tokens": None, "median_ms": None}
    ranks = zip(*(ms for _, ms in steps), strict=True)
    return {"steps": len(steps), "median_tokens": statistics.median(tokens for tokens, _ in steps),
            "median_ms": [round(statistics.median(rank), 4) for rank in ranks]}
