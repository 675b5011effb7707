"""GET /metrics: the service's Prometheus registry, with the figures read from the driver's snapshot at scrape time.

Each engine service has a registry of its own (never prometheus_client's global one): the snapshot's gauges (memory,
pools, floors, health, the layout), the counters the snapshot carries since start (preemptions, recoveries), the
operations the engine knows of by status, and the driver's counters and histograms (engine/telemetry/metrics.py).
docs/engine.md, "Metrics", lists every name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from numbers import Real

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from contracts.control import OperationStatus
from contracts.measurement import STEP_KINDS
from contracts.telemetry import USED_CATEGORIES
from engine.telemetry.schema import validate_snapshot

# Exported even at zero; `queued` only while an operation is (it is queued for an instant).
OPERATION_STATUSES = tuple(status.value for status in OperationStatus if status is not OperationStatus.QUEUED)

RANK_METRICS = (  # (metric, help, path in the rank's snapshot)
    ("seam_rank_total_bytes", "Memory budget of the rank in bytes.", ("total_bytes",)),
    ("seam_rank_free_bytes", "Free bytes on the rank after everything resident.", ("free_bytes",)),
    ("seam_rank_corridor_floor_bytes", "Free bytes the rank must keep to survive traffic.", ("corridor_floor_bytes",)),
    ("seam_rank_arming_floor_bytes", "Corridor floor plus seam reserve, in bytes.", ("arming_floor_bytes",)),
    ("seam_rank_armable", "1 when the rank's free bytes clear its arming floor.", ("armable",)),
    ("seam_kv_tokens_total", "KV pool capacity of the rank in tokens.", ("kv", "tokens_total")),
    ("seam_kv_tokens_used", "KV tokens in use on the rank.", ("kv", "tokens_used")),
    ("seam_state_slots_total", "Recurrent state slots on the rank.", ("state_slots", "total")),
    ("seam_state_slots_used", "Recurrent state slots in use on the rank.", ("state_slots", "used")),
)
ENGINE_METRICS = (  # (metric, help, key in the snapshot's engine)
    ("seam_num_requests_running", "Requests running.", "running"),
    ("seam_num_requests_waiting", "Requests waiting for admission.", "waiting"),
    ("seam_engine_prefill_tokens_per_second", "Prefill throughput over the recent window.", "prefill_tok_s"),
    ("seam_engine_decode_tokens_per_second", "Decode throughput over the recent window.", "decode_tok_s"),
    ("seam_engine_reconfiguring", "1 while a reconfiguration is in progress.", "reconfiguring"),
    ("seam_engine_pool_tokens", "Predicted KV pool of the current layout in tokens.", "pool_tokens"),
    ("seam_engine_healthy", "1 when /healthz is ok: not broken and not in a recovery loop.", "healthy"),
    ("seam_engine_recoveries_in_a_row", "Failed steps recovered since the last step that succeeded.",
     "recoveries_in_a_row"),
)
ENGINE_COUNTERS = (  # since the engine started; the snapshot carries them (the scheduler and step health count)
    ("seam_num_preemptions", "Requests preempted by recompute since start.", "preemptions"),
    ("seam_recoveries", "Failed steps recovered since start.", "recoveries"),
)
LATENCY_METRICS = (  # the snapshot's engine.measurement.latency: recent finished requests of the current layout
    ("seam_engine_latency_requests", "Finished requests the latency medians are over.", "requests"),
    ("seam_engine_ttft_ms", "Median time to first token of recent requests of the current layout, in ms.", "ttft_ms"),
    ("seam_engine_itl_ms", "Median time between output tokens of recent requests of the current layout, in ms.",
     "itl_ms"),
)


def service_registry(driver: object) -> CollectorRegistry:
    """A registry for one engine service: the snapshot read at each scrape, and the driver's own counters and
    histograms where it keeps them (a test's fake driver may not)."""
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: (driver.snapshot().to_dict(),
                                                 [op.to_dict() for op in getattr(driver, "operations", list)()])))
    metrics = getattr(driver, "metrics", None)
    if metrics is not None:
        registry.register(metrics)
    return registry


class SnapshotCollector:
    """A prometheus_client collector of `read()`'s (snapshot, operations), read at every scrape."""

    def __init__(self, read: Callable[[], tuple[dict, list[dict]]]):
        self.read = read

    def collect(self) -> Iterator[Metric]:
        return iter(snapshot_families(*self.read()))


class _Families:
    """Metric families by name, each made on its first sample; an absent figure (None) is left out, not zero."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}

    def gauge(self, name: str, help_text: str, value: object, labels: dict[str, object] | None = None) -> None:
        self._add(GaugeMetricFamily, name, help_text, value, labels or {})

    def counter(self, name: str, help_text: str, value: object) -> None:
        self._add(CounterMetricFamily, name, help_text, value, {})

    def _add(self, kind: type, name: str, help_text: str, value: object, labels: dict[str, object]) -> None:
        if not isinstance(value, Real):
            return
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = kind(name, help_text, labels=list(labels))
        family.add_metric([str(label) for label in labels.values()], float(value))


def _dig(data: object, path: Iterable[str]) -> object:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def snapshot_families(snapshot: dict, operations: list[dict]) -> list[Metric]:
    """The families of one snapshot (validated first) and the engine's operations."""
    validate_snapshot(snapshot)
    out = _Families()
    engine = snapshot["engine"]
    block_size = _dig(engine, ("shape", "block_size"))
    for rank in snapshot["ranks"]:
        labels = {"rank": rank["rank"], "name": rank["name"]}
        for category in USED_CATEGORIES:
            out.gauge("seam_rank_memory_bytes", "Bytes used on the rank, by category.", rank["used"][category],
                      {**labels, "category": category})
        for metric, help_text, path in RANK_METRICS:
            out.gauge(metric, help_text, _dig(rank, path), labels)
        if isinstance(block_size, int) and block_size > 0:
            free = (rank["kv"]["tokens_total"] - rank["kv"]["tokens_used"]) // block_size
            out.gauge("seam_kv_free_blocks", "Free blocks of the rank's KV pool.", free, labels)
    holding = [rank["kv"] for rank in snapshot["ranks"] if rank["kv"]["tokens_total"] > 0]
    if holding:  # the fullest rank: the scheduler refuses a block when any rank holding KV is out of them
        out.gauge("seam_kv_cache_usage_perc", "Fraction of the KV pool in use, 0 to 1 (the fullest rank's).",
                  max(kv["tokens_used"] / kv["tokens_total"] for kv in holding))
    out.gauge("seam_engine_info", "The serving layout: cut and phase as labels.", 1,
              {"cut": ",".join(str(n) for n in engine["cut"]), "phase": engine["phase"]})
    for metric, help_text, key in ENGINE_METRICS:
        out.gauge(metric, help_text, engine.get(key))
    for metric, help_text, key in ENGINE_COUNTERS:
        out.counter(metric, help_text, engine.get(key))
    _measurement(out, snapshot["ranks"], engine.get("measurement"))
    counts = dict.fromkeys(OPERATION_STATUSES, 0)
    for operation in operations:
        status = str(operation.get("status", "unknown"))
        counts[status] = counts.get(status, 0) + 1
    for status, count in counts.items():
        # A gauge: an operation moves from running to its outcome (seam_operations_total counts the outcomes).
        out.gauge("seam_operations_known", "Operations the engine holds, by status (the newest finished ones).",
                  count, {"status": status})
    out.gauge("seam_telemetry_seq", "Sequence number of the snapshot these figures come from.", snapshot["seq"])
    return list(out.families.values())


def _measurement(out: _Families, ranks: list[dict], measurement: object) -> None:
    """Stage medians per rank and kind, and the latency medians, of the snapshot's measurement (if it has one)."""
    for kind in STEP_KINDS:
        per_rank = _dig(measurement, (kind, "median_ms"))
        if per_rank is None:
            continue  # no step of this kind since the layout changed
        for rank, ms in zip(ranks, per_rank, strict=True):
            out.gauge("seam_engine_stage_ms", "Median stage time of the rank over recent steps of the kind, in ms.",
                      ms, {"rank": rank["rank"], "name": rank["name"], "kind": kind})
        for quantile, key in (("0.5", "host_ms"), ("0.9", "host_p90_ms")):
            out.gauge("seam_engine_host_step_ms", "The driver's host time a step (its wall time less the ranks' round "
                      "trip) over recent steps of the kind, in ms.", _dig(measurement, (kind, key)),
                      {"kind": kind, "quantile": quantile})
    for metric, help_text, key in LATENCY_METRICS:
        out.gauge(metric, help_text, _dig(measurement, ("latency", key)))
