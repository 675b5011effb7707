"""Stage times per rank: what a rank times, and what the driver keeps of them."""

import statistics
import time

import torch

from contracts.measurement import NO_STEPS, StageStats
from engine.telemetry.stage_timer import WINDOW, StageLog, StageTimer


def test_a_stage_is_timed_on_the_cpu():
    timer = StageTimer(torch.device("cpu"))
    assert timer.ms is None
    with timer:
        time.sleep(0.02)
    assert 20 <= timer.ms < 200


def test_the_log_keeps_medians_and_spreads_per_kind_and_per_rank():
    log = StageLog()
    decode_ms = [(1.0, 10.0), (3.0, 30.5), (2.0, 20.0)]
    for ms in decode_ms:
        log.add(0, 8, list(ms))
    log.add(512, 0, [40.0, 50.0])
    log.add(0, 8, [None, 5.0])  # a rank that did not time its stage: the step is not kept
    summary = log.summary()
    assert summary["decode"] == StageStats(steps=3, median_tokens=8, median_ms=(2.0, 20.0),
                                           spread_ms=(1.0, round(statistics.stdev([10.0, 30.5, 20.0]), 4)))
    assert summary["decode"].spread_ms[1] == 10.2510  # the sample SD (n - 1), not the population's
    assert summary["prefill"] == StageStats(steps=1, median_tokens=512, median_ms=(40.0, 50.0), spread_ms=(0.0, 0.0))
    for _ in range(WINDOW):
        log.add(0, 1, [7.0, 7.0])
    assert log.summary()["decode"] == StageStats(WINDOW, 1, (7.0, 7.0), (0.0, 0.0))
    assert log.summary()["prefill"] == NO_STEPS  # pushed out of the window
    log.clear()
    assert log.summary() == {"decode": NO_STEPS, "prefill": NO_STEPS}


def test_the_summary_is_what_the_measurement_carries():
    log = StageLog()
    for ms in (2.0, 4.0):
        log.add(0, 3, [ms, ms + 1, ms + 2], host_ms=ms / 10)
    decode = log.summary()["decode"]
    assert StageStats.from_dict(decode.to_dict(), "decode") == decode
    assert decode.to_dict() == {"steps": 2, "median_tokens": 3.0, "median_ms": [3.0, 4.0, 5.0],
                                "spread_ms": [1.4142, 1.4142, 1.4142], "host_ms": 0.3, "host_p90_ms": 0.38}


def test_the_host_time_a_step_has_its_median_and_90th_percentile():
    log = StageLog()
    for host_ms in range(1, 11):  # 1 .. 10 ms
        log.add(0, 1, [5.0], host_ms=float(host_ms))
    decode = log.summary()["decode"]
    assert (decode.host_ms, decode.host_p90_ms) == (5.5, 9.1)
    log.clear()
    log.add(0, 1, [5.0], host_ms=2.0)
    assert (log.summary()["decode"].host_ms, log.summary()["decode"].host_p90_ms) == (2.0, 2.0)


def test_a_measurement_without_host_times_still_parses():
    """An engine from before host times were measured sends no host_ms: the console still reads its stages."""
    stats = StageStats.from_dict({"steps": 1, "median_tokens": 1, "median_ms": [5.0], "spread_ms": [0.0]}, "decode")
    assert (stats.host_ms, stats.host_p90_ms) == (None, None)
