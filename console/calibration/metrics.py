"""The calibration and prediction gauges in the Prometheus text format (GET /api/v1/metrics/).

    seam_prediction_pool_error_ratio{stat="mean"|"max"|"last"}   |measured - predicted| / predicted pool
    seam_prediction_stage_error_ratio{stat="mean"|"max"|"last"}  the same of each job's worst rank stage ms
    seam_calibration_unidentified_ranks                          ranks whose ms per layer is not identified
    seam_calibration_samples                                     measured layouts with decode steps in the fit
    seam_timing_validation_error_ratio{stat="mean"|"max"}       |predicted - measured| / measured pipelined ms of
                                                                 each layout predicted from a fit over the others
    seam_timing_validation_layouts                               layouts held out in that validation (0: none yet)

A statistic without a job to compute it from is left out rather than reported as 0.
"""

from __future__ import annotations

__all__ = ["CONTENT_TYPE", "exposition"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_HELP = {
    "seam_prediction_pool_error_ratio": "Executed jobs' |measured - predicted| / predicted KV pool tokens.",
    "seam_prediction_stage_error_ratio": "Executed jobs' |measured - predicted| / predicted stage ms, worst rank.",
    "seam_calibration_unidentified_ranks": "Ranks whose ms per layer the measured layouts do not identify.",
    "seam_calibration_samples": "Measured layouts with decode steps that the timing is fitted over.",
    "seam_timing_validation_error_ratio": "Leave-one-layout-out |predicted - measured| / measured pipelined ms.",
    "seam_timing_validation_layouts": "Measured layouts held out in the timing model's validation.",
}


def _gauge(lines: list[str], name: str, values: dict[str, float | None] | float) -> None:
    lines += [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} gauge"]
    if isinstance(values, dict):
        lines += [f'{name}{{stat="{stat}"}} {value:.6g}' for stat, value in values.items() if value is not None]
    else:
        lines.append(f"{name} {values:.6g}")


def exposition(summary: dict, calibration: dict) -> str:
    """The gauges from predictions.summary() and coverage.calibration_report()."""
    lines: list[str] = []
    for name, key in (("seam_prediction_pool_error_ratio", "pool_error"),
                      ("seam_prediction_stage_error_ratio", "stage_error")):
        _gauge(lines, name, {stat: summary[key][stat] for stat in ("mean", "max", "last")})
    _gauge(lines, "seam_calibration_unidentified_ranks", len(calibration["unidentified"]))
    _gauge(lines, "seam_calibration_samples", calibration["samples"])
    validation = calibration["validation"]
    _gauge(lines, "seam_timing_validation_error_ratio",
           {"mean": validation["mean_abs_error"], "max": validation["max_abs_error"]})
    _gauge(lines, "seam_timing_validation_layouts", len(validation["layouts"]))
    return "\n".join(lines) + "\n"
