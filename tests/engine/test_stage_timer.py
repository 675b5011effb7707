"""Stage times per rank: what a rank times, and what the driver keeps of them."""

import time

import torch

from engine.stage_timer import WINDOW, StageLog, StageTimer


def test_a_stage_is_timed_on_the_cpu():
    timer = StageTimer(torch.device("cpu"))
    assert timer.ms is None
    with timer:
        time.sleep(0.02)
    assert 20 <= timer.ms < 200


def test_the_log_keeps_medians_per_kind_and_per_rank():
    log = StageLog()
    for ms in (1.0, 3.0, 2.0):
        log.add(0, 8, [ms, 10 * ms])
    log.add(512, 0, [40.0, 50.0])
    log.add(0, 8, [None, 5.0])  # a rank that did not time its stage: the step is not kept
    assert log.summary() == {"decode": {"steps": 3, "median_tokens": 8, "median_ms": [2.0, 20.0]},
                             "prefill": {"steps": 1, "median_tokens": 512, "median_ms": [40.0, 50.0]}}
    for _ in range(WINDOW):
        log.add(0, 1, [7.0, 7.0])
    assert log.summary()["decode"] == {"steps": WINDOW, "median_tokens": 1, "median_ms": [7.0, 7.0]}
    assert log.summary()["prefill"]["steps"] == 0  # pushed out of the window
    log.clear()
    assert log.summary()["decode"] == {"steps": 0, "median_tokens": None, "median_ms": None}
