"""Request latency as the driver logs it: time to first token, time between tokens, medians over the newest."""

from contracts.measurement import Latency
from engine.telemetry.latency import LatencyLog


def _serve(log: LatencyLog, request_id: int, submitted: float, token_times: list[float], reason: str = "length"):
    log.submitted(request_id, at=submitted)
    for at in token_times:
        log.emitted([request_id], at=at)
    log.finished(request_id, reason)


def test_an_empty_log_has_no_medians():
    assert LatencyLog().summary() == Latency(requests=0, ttft_ms=None, itl_ms=None)


def test_time_to_first_token_and_between_tokens_are_medians_over_requests():
    log = LatencyLog()
    _serve(log, 1, 10.0, [10.050, 10.060, 10.070])  # ttft 50 ms, itl (20 ms / 2) = 10 ms
    _serve(log, 2, 20.0, [20.200, 20.230], "stop")  # ttft 200 ms, itl 30 ms
    _serve(log, 3, 30.0, [30.020])  # ttft 20 ms; one token: no time between tokens
    summary = log.summary()
    assert summary.requests == 3
    assert summary.ttft_ms == 50.0  # median of 50, 200, 20
    assert summary.itl_ms == 20.0  # median of 10 and 30: the one-token request has none


def test_one_step_serves_several_requests_at_one_time():
    log = LatencyLog()
    log.submitted(1, at=0.0)
    log.submitted(2, at=0.5)
    log.emitted([1, 2], at=1.0)
    log.emitted([1, 2], at=1.004)
    log.finished(1, "length")
    log.finished(2, "stop")
    assert log.summary() == Latency(requests=2, ttft_ms=750.0, itl_ms=4.0)


def test_only_requests_that_ran_to_their_end_count():
    log = LatencyLog()
    for request_id, reason in enumerate(("cancelled", "refused", "error")):
        _serve(log, request_id, 0.0, [0.1, 0.2], reason)
    log.submitted(9, at=0.0)
    log.finished(9, "refused")  # refused before any token
    assert log.summary().requests == 0
    assert log.open == {}  # nothing of theirs is held


def test_the_window_keeps_the_newest_requests():
    log = LatencyLog(window=3)
    for request_id, ttft in enumerate((900.0, 1.0, 2.0, 3.0)):
        _serve(log, request_id, 0.0, [ttft / 1e3])
    assert log.summary() == Latency(requests=3, ttft_ms=2.0, itl_ms=None)  # the 900 ms one was pushed out


def test_a_layout_change_clears_the_log_and_forgets_requests_in_flight():
    log = LatencyLog()
    _serve(log, 1, 0.0, [0.1, 0.2])
    log.submitted(2, at=0.0)
    log.emitted([2], at=0.3)
    log.clear()  # what PipelineDriver.adopt does for every new layout
    assert log.summary() == Latency(requests=0, ttft_ms=None, itl_ms=None)
    log.emitted([2], at=5.0)  # request 2 spans both layouts: never counted
    log.finished(2, "length")
    _serve(log, 3, 10.0, [10.008, 10.010])
    assert log.summary() == Latency(requests=1, ttft_ms=8.0, itl_ms=2.0)
