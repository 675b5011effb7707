"""The engine's counters and histograms (engine/telemetry/metrics.py): fed with known times, and after real traffic
through the run's shared engine service, read from its /metrics as Prometheus would."""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest

from engine.telemetry.metrics import EngineMetrics
from tests.support.metrics import Samples, parse_samples, scrape

MODEL = (("model_name", "demo"),)


def _collected(metrics: EngineMetrics) -> Samples:
    registry = CollectorRegistry()
    registry.register(metrics)
    return parse_samples(generate_latest(registry).decode())


def test_a_requests_timeline_fills_each_histogram():
    metrics = EngineMetrics("demo", ["r0", "r1"])
    metrics.submitted(1, prompt_tokens=9, at=10.0)
    metrics.scheduled([1], at=10.5)
    metrics.scheduled([1], at=10.9)  # still computing its prompt: its queue ended at the first step
    metrics.emitted([1], at=11.0)
    metrics.emitted([1], at=11.25)
    metrics.emitted([1], at=11.75)
    metrics.finished(1, "stop", at=12.0)
    samples = _collected(metrics)
    assert samples[("seam_request_queue_time_seconds_sum", MODEL)] == 0.5
    assert samples[("seam_time_to_first_token_seconds_sum", MODEL)] == 1.0
    assert samples[("seam_inter_token_latency_seconds_count", MODEL)] == 2
    assert samples[("seam_inter_token_latency_seconds_sum", MODEL)] == 0.75
    assert samples[("seam_e2e_request_latency_seconds_sum", MODEL)] == 2.0
    assert samples[("seam_prompt_tokens_total", MODEL)] == 9
    assert samples[("seam_generation_tokens_total", MODEL)] == 3
    assert samples[("seam_request_success_total", (("finished_reason", "stop"), *MODEL))] == 1
    # The bucket an ITL of 0.25 s falls in, and the one below it, say where the two gaps were.
    assert samples[("seam_inter_token_latency_seconds_bucket", (("le", "0.2"), *MODEL))] == 0
    assert samples[("seam_inter_token_latency_seconds_bucket", (("le", "0.3"), *MODEL))] == 1


def test_a_request_that_did_not_run_to_its_end_is_counted_but_not_timed():
    metrics = EngineMetrics("demo", ["r0"])
    metrics.submitted(1, prompt_tokens=4, at=0.0)
    metrics.emitted([1], at=0.5)
    metrics.finished(1, "cancelled", at=9.0)
    samples = _collected(metrics)
    assert samples[("seam_request_success_total", (("finished_reason", "cancelled"), *MODEL))] == 1
    assert samples[("seam_request_success_total", (("finished_reason", "stop"), *MODEL))] == 0  # there from start
    assert samples[("seam_e2e_request_latency_seconds_count", MODEL)] == 0


def test_stage_times_are_per_rank_and_kind_in_seconds():
    metrics = EngineMetrics("demo", ["big", "small"])
    metrics.stage_times(prefill_tokens=12, stage_ms=[4.0, 2.0])
    metrics.stage_times(prefill_tokens=0, stage_ms=[1.5, None])  # an untimed rank is left out
    samples = _collected(metrics)
    for rank, name, kind, count, total in (("0", "big", "prefill", 1, 0.004), ("1", "small", "prefill", 1, 0.002),
                                           ("0", "big", "decode", 1, 0.0015), ("1", "small", "decode", 0, 0.0)):
        labels = (("kind", kind), ("name", name), ("rank", rank))
        assert samples[("seam_rank_stage_time_seconds_count", labels)] == count
        assert samples[("seam_rank_stage_time_seconds_sum", labels)] == total


def test_engines_in_one_process_keep_their_own_counts():
    first, second = EngineMetrics("demo", ["r0"]), EngineMetrics("demo", ["r0"])
    first.operation_finished("cut", "succeeded")
    assert _collected(first)[("seam_operations_total", (("kind", "cut"), ("outcome", "succeeded")))] == 1
    assert _collected(second)[("seam_operations_total", (("kind", "cut"), ("outcome", "succeeded")))] == 0
    assert b"seam_" not in generate_latest(prometheus_client.REGISTRY)  # nothing leaks into the global registry


def _delta(after: Samples, before: Samples, name: str, labels: tuple = ()) -> float:
    return after[(name, labels)] - before.get((name, labels), 0.0)


def test_counters_and_histograms_follow_real_traffic(live_engine):
    """Three requests of known lengths, one after another: every counter grows by exactly what they were."""
    model = (("model_name", live_engine.state()["model"]),)
    requests = [(list(range(3, 3 + prompt)), tokens) for prompt, tokens in ((5, 4), (11, 6), (23, 3))]
    before = scrape(live_engine.client)
    for prompt, tokens in requests:
        reply = live_engine.client.post("/v1/completions", headers=live_engine.api_headers(), json={
            "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True})
        assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] == "length", reply.text
    after = scrape(live_engine.client)
    generated = sum(tokens for _, tokens in requests)
    assert _delta(after, before, "seam_generation_tokens_total", model) == generated
    assert _delta(after, before, "seam_prompt_tokens_total", model) == sum(len(prompt) for prompt, _ in requests)
    assert _delta(after, before, "seam_request_success_total", (("finished_reason", "length"), *model)) == 3
    for histogram in ("seam_time_to_first_token_seconds", "seam_e2e_request_latency_seconds",
                      "seam_request_queue_time_seconds"):
        assert _delta(after, before, f"{histogram}_count", model) == len(requests), histogram
        assert _delta(after, before, f"{histogram}_sum", model) > 0, histogram
    assert _delta(after, before, "seam_inter_token_latency_seconds_count", model) == generated - len(requests)
    assert (_delta(after, before, "seam_time_to_first_token_seconds_sum", model)
            < _delta(after, before, "seam_e2e_request_latency_seconds_sum", model))
    ranks = live_engine.state()["ranks"]
    for rank, row in enumerate(ranks):  # one decode step per token after the first, timed on every rank
        labels = (("kind", "decode"), ("name", row["name"]), ("rank", str(rank)))
        assert _delta(after, before, "seam_rank_stage_time_seconds_count", labels) == generated - len(requests)
    assert after[("seam_num_requests_running", ())] == 0 and after[("seam_kv_cache_usage_perc", ())] == 0
