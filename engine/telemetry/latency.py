"""Each finished request's latency as the driver sees it, and the medians over the newest ones.

Per request: the time to its first token (from `submit` to the first token handed to its client) and the mean
time between its output tokens (only with two or more). Only requests that ran to their end (`stop` or `length`)
count: a cancelled, refused or failed one says nothing about the layout. Like the stage log, the log is cleared
when the layout changes, requests in flight included: their latency would span two layouts.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from contracts.measurement import Latency

WINDOW = 256  # finished requests kept: the medians follow the current workload
COMPLETED = ("stop", "length")


@dataclass
class _Open:
    """A request in flight: when it was submitted, when its first and latest tokens went out, how many."""

    submitted: float
    first: float | None = None
    latest: float | None = None
    tokens: int = 0


class LatencyLog:
    """Times in seconds of `time.monotonic()` unless `at` is given; the medians come out in ms."""

    def __init__(self, window: int = WINDOW) -> None:
        self.open: dict[int, _Open] = {}
        self.done: deque[tuple[float, float | None]] = deque(maxlen=window)  # (ttft ms, itl ms or None)

    def submitted(self, request_id: int, at: float | None = None) -> None:
        self.open[request_id] = _Open(_now(at))

    def emitted(self, request_ids: Iterable[int], at: float | None = None) -> None:
        """One output token went out to each of these requests (one step's tokens share their time)."""
        now = _now(at)
        for request_id in request_ids:
            request = self.open.get(request_id)
            if request is None:
                continue  # submitted before the layout changed: not counted
            if request.first is None:
                request.first = now
            request.latest, request.tokens = now, request.tokens + 1

    def finished(self, request_id: int, reason: str) -> None:
        request = self.open.pop(request_id, None)
        if request is None or request.first is None or reason not in COMPLETED:
            return
        ttft_ms = (request.first - request.submitted) * 1e3
        itl_ms = (request.latest - request.first) * 1e3 / (request.tokens - 1) if request.tokens >= 2 else None
        self.done.append((ttft_ms, itl_ms))

    def clear(self) -> None:
        self.open.clear()
        self.done.clear()

    def summary(self) -> Latency:
        ttfts = [ttft for ttft, _ in self.done]
        itls = [itl for _, itl in self.done if itl is not None]
        return Latency(len(self.done), _median_ms(ttfts), _median_ms(itls))


def _now(at: float | None) -> float:
    return time.monotonic() if at is None else at


def _median_ms(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None
