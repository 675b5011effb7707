"""The console's metrics in the Prometheus exposition (GET /api/v1/metrics/), read from the database at scrape time.

One custom collector (prometheus_client's idiom for figures another store owns) in a registry of the console's own:

    seam_prediction_pool_error_ratio{stat="mean"|"max"|"last"}   |measured - predicted| / predicted pool
    seam_prediction_stage_error_ratio{stat="mean"|"max"|"last"}  the same of each job's worst rank stage ms
    seam_calibration_unidentified_ranks                          ranks whose ms per layer is not identified
    seam_calibration_samples                                     measured layouts with decode steps in the fit
    seam_timing_validation_error_ratio{stat="mean"|"max"}       |predicted - measured| / measured pipelined ms of
                                                                 each layout predicted from a fit over the others
    seam_timing_validation_layouts                               layouts held out in that validation (0: none yet)
    seam_jobs{status}                                            jobs in each status that may still move
    seam_jobs_finished_total{status}                             jobs that ended, by final status
    seam_job_speed_verdicts_total{verdict}                       succeeded jobs' final speed verdicts (met, missed,
                                                                 unmeasured)
    seam_layout_observations_total{cause}                        layouts the console saw the engine run, by cause
                                                                 (`unexplained`: a change no job caused)
    seam_audit_chain_verified                                    1 when the audit chain verifies, else 0
    seam_audit_chain_anchored                                    1 when it is held against the anchor file
    seam_audit_events                                            events whose links verified

Jobs, verdicts and observations are never deleted and a final status never changes, so their counts only grow:
counters, which increase() reads. The audit chain is walked at each scrape without the engine's witness (a scrape
must not call the engine); `manage.py verify_audit` holds it against the witness too. A statistic without a job to
compute it from is left out rather than reported as 0.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from console.audit.anchor import AnchorState
from console.audit.services import verify_chain
from console.calibration.coverage import calibration_report
from console.calibration.models import JobPrediction
from console.calibration.predictions import summary
from console.jobs.choices import ACTIVE, TERMINAL, UNJUDGED, JobStatus, SpeedVerdict
from console.jobs.models import Job, LayoutCause, LayoutObservation

__all__ = ["CONTENT_TYPE", "REGISTRY", "exposition"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
FINAL_VERDICTS = tuple(verdict.value for verdict in SpeedVerdict if verdict.value not in UNJUDGED)


def _stats(name: str, help_text: str, values: dict[str, float | None]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=["stat"])
    for stat, value in values.items():
        if value is not None:
            family.add_metric([stat], value)
    return family


def _by(kind: type, name: str, help_text: str, label: str, counts: dict[str, int], values: tuple[str, ...]) -> Metric:
    """One sample per value of `label`, zero included: a series that exists from the start shows its first rise."""
    family = kind(name, help_text, labels=[label])
    for value in values:
        family.add_metric([value], counts.get(value, 0))
    return family


def _counts(queryset, field: str) -> dict[str, int]:
    return {row[field]: row["n"] for row in queryset.values(field).annotate(n=Count("id")).order_by()}


class ConsoleCollector:
    """Reads the console's database at every scrape."""

    def collect(self) -> Iterator[Metric]:
        yield from self._predictions()
        yield from self._jobs()
        yield from self._audit()

    def _predictions(self) -> Iterator[Metric]:
        errors = summary(JobPrediction.objects.order_by("-created", "-id"))
        yield _stats("seam_prediction_pool_error_ratio", "Executed jobs' |measured - predicted| / predicted KV pool "
                     "tokens.", {stat: errors["pool_error"][stat] for stat in ("mean", "max", "last")})
        yield _stats("seam_prediction_stage_error_ratio", "Executed jobs' |measured - predicted| / predicted stage "
                     "ms, worst rank.", {stat: errors["stage_error"][stat] for stat in ("mean", "max", "last")})
        calibration = calibration_report()
        yield GaugeMetricFamily("seam_calibration_unidentified_ranks", "Ranks whose ms per layer the measured "
                                "layouts do not identify.", value=len(calibration["unidentified"]))
        yield GaugeMetricFamily("seam_calibration_samples", "Measured layouts with decode steps that the timing is "
                                "fitted over.", value=calibration["samples"])
        validation = calibration["validation"]
        yield _stats("seam_timing_validation_error_ratio", "Leave-one-layout-out |predicted - measured| / measured "
                     "pipelined ms.", {"mean": validation["mean_abs_error"], "max": validation["max_abs_error"]})
        yield GaugeMetricFamily("seam_timing_validation_layouts", "Measured layouts held out in the timing model's "
                                "validation.", value=len(validation["layouts"]))

    def _jobs(self) -> Iterator[Metric]:
        statuses = _counts(Job.objects.all(), "status")
        yield _by(GaugeMetricFamily, "seam_jobs", "Jobs in each status that may still move.", "status", statuses,
                  tuple(status.value for status in JobStatus if status in ACTIVE))
        yield _by(CounterMetricFamily, "seam_jobs_finished", "Jobs that ended, by final status.", "status", statuses,
                  tuple(status.value for status in JobStatus if status in TERMINAL))
        verdicts = _counts(Job.objects.filter(status=JobStatus.SUCCEEDED), "speed_verdict")
        yield _by(CounterMetricFamily, "seam_job_speed_verdicts", "Succeeded jobs' final speed verdicts: the "
                  "measured speedup against the predicted one.", "verdict", verdicts, FINAL_VERDICTS)
        causes = _counts(LayoutObservation.objects.all(), "cause")
        yield _by(CounterMetricFamily, "seam_layout_observations", "Layouts the console saw the engine run, by what "
                  "explains them (unexplained: a change no job of the console caused).", "cause", causes,
                  tuple(LayoutCause.values))

    def _audit(self) -> Iterator[Metric]:
        result = verify_chain()
        yield GaugeMetricFamily("seam_audit_chain_verified", "1 when the audit chain verifies (links, keyed hashes, "
                                "anchored events), else 0.", value=int(result.ok))
        yield GaugeMetricFamily("seam_audit_chain_anchored", "1 when the audit chain is held against the anchor "
                                "file.", value=int(result.anchor == AnchorState.ANCHORED))
        yield GaugeMetricFamily("seam_audit_events", "Audit events whose links verified.", value=result.checked)


REGISTRY = CollectorRegistry()
REGISTRY.register(ConsoleCollector())


def exposition() -> bytes:
    """The console's metrics as they stand now."""
    return generate_latest(REGISTRY)
