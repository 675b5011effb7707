"""Ordinary least squares of a stage time against a layer count: the one line fit calibration uses.

Shared by solvers/calibration.py (coverage) and solvers/timing_fit.py (the fitted timing model), so
the slope, intercept and their standard errors are computed in exactly one place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LineFit:
    """y = slope x + intercept; the residual SD and the SEs need residual dof > 0 (else None)."""

    slope: float
    intercept: float
    residual_sd: float | None
    dof: int
    n: int
    x_mean: float
    sxx: float  # Σ (x - x̄)²: > 0, the x took at least two values

    @property
    def slope_se(self) -> float | None:
        return None if self.residual_sd is None else self.residual_sd / math.sqrt(self.sxx)

    @property
    def intercept_se(self) -> float | None:
        if self.residual_sd is None:
            return None
        return self.residual_sd * math.sqrt(1 / self.n + self.x_mean**2 / self.sxx)

    @property
    def covariance(self) -> float | None:
        """Cov(slope, intercept) = -x̄ σ² / Sxx: the two estimates trade off along the line."""
        return None if self.residual_sd is None else -self.x_mean * self.residual_sd**2 / self.sxx


def fit_line(xs: Sequence[int], ys: Sequence[float]) -> LineFit:
    """Least squares through (xs, ys); the caller ensures xs took at least two values."""
    n = len(xs)
    x_bar, y_bar = sum(xs) / n, sum(ys) / n
    sxx = sum((x - x_bar) ** 2 for x in xs)
    slope = sum((x - x_bar) * (y - y_bar) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = y_bar - slope * x_bar
    dof = n - 2
    if dof <= 0:
        return LineFit(slope, intercept, None, dof, n, x_bar, sxx)  # a line through two points has no residual
    rss = sum((y - slope * x - intercept) ** 2 for x, y in zip(xs, ys, strict=True))
    return LineFit(slope, intercept, math.sqrt(rss / dof), dof, n, x_bar, sxx)


@dataclass(frozen=True)
class OriginFit:
    """y = slope x (no intercept): the least-squares line when the intercept is held at 0."""

    slope: float
    residual_sd: float | None  # None without residual dof (one sample)
    sxx: float  # Σ x²

    @property
    def slope_se(self) -> float | None:
        return None if self.residual_sd is None else self.residual_sd / math.sqrt(self.sxx)


def fit_origin(xs: Sequence[int], ys: Sequence[float]) -> OriginFit:
    """Least squares of y = slope x; the caller ensures every x is positive."""
    sxx = sum(x * x for x in xs)
    slope = sum(x * y for x, y in zip(xs, ys, strict=True)) / sxx
    dof = len(xs) - 1
    if dof <= 0:
        return OriginFit(slope, None, sxx)
    rss = sum((y - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return OriginFit(slope, math.sqrt(rss / dof), sxx)
